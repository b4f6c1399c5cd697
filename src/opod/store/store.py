"""The leader's durable state: one ``Store`` over SQLite or PostgreSQL.

The API is synchronous; the leader calls it through ``asyncio.to_thread``, off the hot path. Every
method is one transaction and returns frozen records, never live database objects.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import TracebackType

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from opod.security.private import tighten
from opod.security.sealing import SecretsKey
from opod.store.audit import AuditRepo
from opod.store.capacity import CapacityRepo
from opod.store.client_jobs import ClientJobsRepo
from opod.store.commits import CommitsRepo
from opod.store.engine import make_engine, mask, reason, resolve_url, sqlite_files, use_incremental_vacuum
from opod.store.errors import StoreError
from opod.store.evals import EvalsRepo
from opod.store.events import EventsRepo
from opod.store.federation import FederationRepo
from opod.store.files import FilesRepo
from opod.store.guard_attachments import GuardAttachmentsRepo
from opod.store.keys import KeysRepo
from opod.store.meta import MetaRepo
from opod.store.migrate import upgrade
from opod.store.models import ModelsRepo
from opod.store.nodes import NodesRepo
from opod.store.people import PeopleRepo
from opod.store.placements import PlacementsRepo
from opod.store.presets import PresetsRepo
from opod.store.quotas import QuotasRepo
from opod.store.requests import RequestsRepo
from opod.store.scim import ScimRepo
from opod.store.secrets import SecretsRepo
from opod.store.serve_jobs import ServeJobsRepo
from opod.store.settings import SettingsRepo
from opod.store.signin import SignInRepo
from opod.store.tenancy import TenancyRepo
from opod.store.update_checks import UpdateChecksRepo
from opod.store.usage import UsageRepo

log = logging.getLogger("opod.store")


class Store(
    KeysRepo,
    NodesRepo,
    ModelsRepo,
    PlacementsRepo,
    MetaRepo,
    RequestsRepo,
    UsageRepo,
    EventsRepo,
    CapacityRepo,
    PresetsRepo,
    AuditRepo,
    SettingsRepo,
    TenancyRepo,
    PeopleRepo,
    SecretsRepo,
    FilesRepo,
    ClientJobsRepo,
    QuotasRepo,
    GuardAttachmentsRepo,
    FederationRepo,
    ScimRepo,
    ServeJobsRepo,
    UpdateChecksRepo,
    SignInRepo,
    EvalsRepo,
    CommitsRepo,
):
    def __init__(self, engine: Engine, secrets_key: SecretsKey | None = None) -> None:
        """Use :meth:`open`; this wraps an engine whose database is already migrated."""
        self._engine = engine
        self._secrets_key = secrets_key
        self._marks_lock = threading.Lock()

    @classmethod
    def open(cls, url: str | None = None, *, home: Path | None = None, secrets_key: SecretsKey | None = None) -> Store:
        """Connect and migrate to the newest schema.

        ``url`` defaults to ``OPOD_DATABASE_URL``, then to SQLite at ``<home>/opod.db`` (``home``
        defaults to ``OPOD_HOME`` or ``~/.opod``). A SQLite file is 0600 from its creation, and one
        found readable by others is made so, with a warning. ``secrets_key`` seals the secrets
        (:meth:`adopt_secrets_key`: a store sealed with another key is refused); without it the
        store keeps and reads none. Raises StoreError naming the URL (password masked) and the
        reason when the database cannot be reached or migrated.
        """
        resolved = resolve_url(url, home)
        for line in tighten(sqlite_files(resolved)):
            log.warning("%s", line)
        engine = make_engine(resolved)
        try:
            try:
                with engine.connect():
                    pass
            except DBAPIError as err:
                raise StoreError(f"cannot open the store at {mask(resolved)}: {reason(err)}") from err
            try:
                upgrade(engine)
            except DBAPIError as err:
                raise StoreError(f"cannot migrate the store at {mask(resolved)}: {reason(err)}") from err
            if use_incremental_vacuum(engine):
                log.info("the store at %s now gives the space of deleted rows back to the file system", mask(resolved))
            store = cls(engine, secrets_key)
            if secrets_key is not None:
                sealed = store.adopt_secrets_key()
                if sealed:
                    log.warning(
                        "%d secrets kept in clear in the store are now sealed with %s", sealed, secrets_key.where
                    )
        except BaseException:
            engine.dispose()
            raise
        return store

    @property
    def url(self) -> str:
        """The database URL with its password masked."""
        return mask(self.engine.url)

    @property
    def closed(self) -> bool:
        return self._engine is None

    def close(self) -> None:
        """Release every connection; calling it again does nothing."""
        if self._engine is not None:
            self._close_commit_marks()  # a connection held out of the pool, which dispose leaves open
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url})" if self._engine is not None else "Store(closed)"
