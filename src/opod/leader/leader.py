"""The leader, assembled: the store, the in-memory state rebuilt from it, and the listeners' apps.

Start-up reads the store once (keys, node tokens, nodes, models, placements);
from then on the request path reads memory only, and every change is written
to the store first and to memory in the same moment.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opod import config
from opod.access.keytable import KeyEntry, KeyTable
from opod.access.nodetokens import LOCAL_TOKEN_ID, NodeToken, NodeTokenBook
from opod.catalog import Catalog, load_catalog
from opod.contract import adminapi, nodeapi
from opod.contract import env as contract_env
from opod.contract.catalog import Entry
from opod.control.app import create_app as create_control_app
from opod.control.context import ControlContext
from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.gateway.admission import Admission, fleet_capacity
from opod.gateway.app import Gateway
from opod.gateway.guardrails import Guardrails
from opod.gateway.prefix import PrefixHasher
from opod.gateway.relay import Relay
from opod.http.nodeclient import WorkerClient
from opod.leader.adminv1.context import AdminContext
from opod.leader.nodes import NodeRegistry
from opod.leader.public import probe_app, public_app
from opod.leader.reconciler import Reconciler
from opod.ledger import Ledger
from opod.security.keys import ADMIN_PREFIX, display_prefix, hash_key, new_secret
from opod.security.nodetokens import NodeTokenMinter, load_or_create_secret
from opod.shards import ShardError, ShardManager
from opod.snapshots.auth import meta_tombstones
from opod.snapshots.service import Snapshots
from opod.store import Store

log = logging.getLogger("opod.leader")

DEFAULT_MODELS = ("smollm2-135m-instruct", "all-minilm-l6-v2")

DEFAULT_ADMISSION = adminapi.PolicyAdmission(hold_ms=30_000, max_held=1024)
"""Without a policy file, a request waits up to 30 s for an engine slot; a mounted policy's admission
block replaces this whole (and there, as the contract says, zero means shed at once)."""


@dataclass
class LeaderSettings:
    home: Path
    database_url: str | None = None
    require_keys: bool = True
    default_models: bool = True


@dataclass
class Leader:
    settings: LeaderSettings
    store: Store
    catalog: Catalog
    keys: KeyTable = field(default_factory=KeyTable)
    fleet: Fleet = field(default_factory=Fleet)
    models: ModelRegistry = field(default_factory=ModelRegistry)
    tokens: NodeTokenBook | None = None
    workers: WorkerClient | None = None
    reconciler: Reconciler | None = None
    gateway: Gateway | None = None
    registry: NodeRegistry | None = None
    ledger: Any = None
    """``opod.ledger.Ledger``: usage rows and lifecycle events."""
    shards: Any = None
    """``opod.shards.ShardManager`` when sharded models are available."""
    tls: Any = None
    """``opod.http.tls.server.LeaderTLS`` when the public listener serves HTTPS."""
    snapshots: Any = None
    """``opod.snapshots.service.Snapshots``: the mounted auth, policy and plan files."""
    _admin: AdminContext | None = None
    new_admin_key: str | None = None
    """The admin key's plaintext when this start created it: shown once, then forgotten."""
    boot: int = 0

    # --- start-up -------------------------------------------------------------

    @classmethod
    def open(cls, settings: LeaderSettings) -> Leader:
        settings.home.mkdir(parents=True, exist_ok=True)
        store = Store.open(settings.database_url, home=settings.home)
        leader = cls(settings=settings, store=store, catalog=load_catalog())
        for problem in leader.catalog.problems:
            log.warning("catalog: %s", problem)
        leader.boot = store.next_boot()
        leader.ledger = Ledger.open(store, settings.home, boot=leader.boot)
        minter = NodeTokenMinter(load_or_create_secret(settings.home / "node-secret"))
        leader.tokens = NodeTokenBook(minter)
        leader.workers = WorkerClient(leader.tokens.token_for_node)
        leader.reconciler = Reconciler(leader.fleet, leader.models, leader.workers)
        leader.gateway = Gateway(leader.fleet, leader.models, leader.keys, Relay(leader.fleet, leader.workers), settings.require_keys)
        leader.gateway.admission = Admission(fleet_capacity(leader.fleet), DEFAULT_ADMISSION)
        leader.gateway.ledger = leader.ledger
        leader.gateway.prefix = PrefixHasher(leader.fleet, leader.gateway.relay.index, leader.workers)
        leader.reconciler.housekeeping = leader.gateway.relay.index.sweep
        leader.shards = ShardManager(
            leader.fleet, leader.workers, leader._entry_for, emit=leader.emit,
            coordinator_node=config.read(contract_env.ENV_COORDINATOR_NODE) or None,
        )
        saved = store.get_meta("shards")
        if saved:
            try:
                leader.shards.from_json(saved)
            except ShardError as err:
                log.error("the saved gangs could not be restored (%s); they must be created again", err)
        leader.registry = NodeRegistry(leader.fleet, leader.tokens, leader.persist, leader.reconciler.kick, leader.emit,
                                       index=leader.gateway.relay.index)
        leader._load_keys()
        leader._ensure_admin_key()
        leader._load_nodes()
        leader._load_models()
        return leader

    def _load_keys(self) -> None:
        assert self.tokens is not None
        for record in self.store.list_keys():
            if record.kind == "node":
                self.tokens.put(NodeToken(record.id, record.name, record.expires_at, revoked=record.revoked_at is not None))
            else:
                self.keys.put(KeyEntry(record.id, record.kind, record.name, record.hash, record.expires_at, record.revoked_at is not None, record.team, record.admission_class))

    def _ensure_admin_key(self) -> None:
        path = self.settings.home / "admin.key"
        admins = [r for r in self.store.list_keys("admin") if r.revoked_at is None]
        if admins and path.exists() and any(r.hash == hash_key(path.read_text().strip()) for r in admins):
            return
        now = datetime.now(UTC)
        for stale in admins:
            # The file that held the old key is gone or differs: that key can no longer be handed out.
            self.store.revoke_key(stale.id, now)
            self.keys.revoke(stale.id)
        secret = new_secret(ADMIN_PREFIX)
        record = self.store.create_key(kind="admin", name="admin", hash=hash_key(secret), prefix=display_prefix(secret))
        self.keys.put(KeyEntry(record.id, "admin", record.name, record.hash))
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secret + "\n")
        os.replace(tmp, path)
        self.new_admin_key = secret

    def _load_nodes(self) -> None:
        assert self.tokens is not None
        for record in self.store.list_nodes():
            try:
                hardware = nodeapi.decode_hardware(record.hardware_json)
            except ValueError:
                hardware = nodeapi.Capabilities()
            node = NodeState(id=record.id, address=record.address, hostname=record.hostname, boot_id=record.boot_id,
                             token_id=record.token_id or "", hardware=hardware, drained=record.drained)
            self.fleet.restore(node)
            if record.token_id:
                self.tokens.bind(record.id, record.token_id)

    def _load_models(self) -> None:
        records = self.store.list_models()
        if not records and self.settings.default_models and self.store.get_meta("default_models") is None:
            for model_id in DEFAULT_MODELS:
                entry = self.catalog.get(model_id)
                if entry is not None:
                    self.store.add_model(model_id, source_json=json.dumps(entry.source.to_wire()))
                    self.store.set_placement(model_id, ANY_NODE, "loaded")
            self.store.set_meta("default_models", "added")
            records = self.store.list_models()
        placements: dict[str, dict[str, str]] = {}
        for placement in self.store.list_placements():
            placements.setdefault(placement.model_id, {})[placement.node_id] = placement.wanted
        for record in records:
            entry = Entry.from_wire(record.entry_json) if record.entry_json else self.catalog.get(record.id)
            self.models.put(KnownModel(id=record.id, entry=entry, engine=record.engine, wanted=placements.get(record.id, {})))

    def _entry_for(self, model_id: str) -> Entry | None:
        known = self.models.get(model_id)
        return known.entry if known is not None and known.entry is not None else self.catalog.get(model_id)

    def local_worker_token(self) -> str:
        """The token the worker of ``opod up`` joins with (created on first use)."""
        assert self.tokens is not None
        token = self.tokens.minter.token(LOCAL_TOKEN_ID)
        existing = [r for r in self.store.list_keys("node") if r.id == LOCAL_TOKEN_ID]
        if not existing:
            self.store.create_key(kind="node", name="opod up's local worker", hash=hash_key(token), prefix=display_prefix(token), id=LOCAL_TOKEN_ID)
            self.tokens.put(NodeToken(LOCAL_TOKEN_ID, "local worker"))
        elif existing[0].revoked_at is not None:
            raise RuntimeError("the local worker's node token (t_local) was revoked; run opod up --no-worker, or remove ~/.opod to start afresh")
        return token

    # --- running -------------------------------------------------------------------

    async def persist(self, method: str, kwargs: dict) -> None:
        """Write to the store off the event loop; a failure is logged, never raised into a request."""
        try:
            await asyncio.to_thread(getattr(self.store, method), **kwargs)
        except Exception as err:  # the in-memory state stays right; the store catches up on the next write
            log.warning("store %s failed: %s", method, err)

    def control_context(self) -> ControlContext:
        assert self.tokens is not None and self.reconciler is not None
        return ControlContext(
            store=self.store, keys=self.keys, tokens=self.tokens, fleet=self.fleet, models=self.models,
            catalog=self.catalog, models_changed=self.reconciler.kick, model_status=self.reconciler.status, emit=self.emit,
            forget_node=self.gateway.relay.index.forget if self.gateway is not None else (lambda _: None),
        )

    def admin_app(self):
        return create_control_app(self.control_context())

    def emit(self, type: str, subject: str, data: dict | None = None) -> None:
        """A lifecycle event for the event stream; logged when the leader has no ledger."""
        if self.ledger is not None:
            self.ledger.event(type, subject, data or {})
        else:
            log.info("event %s %s %s", type, subject, data or {})

    def admin_context(self) -> AdminContext:
        if self._admin is None:
            assert self.workers is not None and self.reconciler is not None and self.gateway is not None
            self._admin = AdminContext(
                store=self.store, fleet=self.fleet, models=self.models, workers=self.workers, stats=self.gateway.stats,
                kick_reconciler=self.reconciler.kick, emit=self.emit, ledger=self.ledger, shards=self.shards,
                plan=self.gateway.plan, prefix_index=self.gateway.relay.index.stats, tls=lambda: self.tls is not None,
            )
        return self._admin

    def public_app(self):
        return public_app(self, self.admin_context())

    def probe_app(self):
        return probe_app(self, self.admin_context())

    async def start_snapshots(self) -> None:
        """Watch the auth, policy and plan files a manager mounts (CONTRACT.md §3), and apply them live."""
        assert self.gateway is not None
        load, add = meta_tombstones(self.store.get_meta, self.store.set_meta)
        self.snapshots = Snapshots(self.keys, self.emit, load_tombstones=load, add_tombstones=add, client_certs_verified=False)
        gateway = self.gateway
        gateway.guardrails = Guardrails()
        gateway.policy = lambda: self.snapshots.policy.view() if self.snapshots.policy.current() is not None else None
        gateway.plan = self.snapshots.plan.current
        self.snapshots.policy.subscribe(self._policy_applied)
        await self.snapshots.start()

    def _policy_applied(self, view) -> None:
        assert self.gateway is not None
        if view.access_log is not None:
            self.gateway.access_log = view.access_log
        admission = view.snapshot.admission
        # An empty admission block means "as before": opod's own default, not shedding at once.
        policy = admission if admission.to_wire() else DEFAULT_ADMISSION
        if self.gateway.admission is not None:
            self.gateway.admission.configure(policy)

    async def stop_snapshots(self) -> None:
        if self.snapshots is not None:
            await self.snapshots.stop()
        if self.gateway is not None and self.gateway.guardrails is not None:
            await self.gateway.guardrails.close()

    async def close(self) -> None:
        if self.workers is not None:
            await self.workers.close()
        if self.ledger is not None:
            await self.ledger.flush()
            self.ledger.close()
        await asyncio.to_thread(self.store.close)

    def wait_ready(self) -> bool:
        return bool(self.fleet.served_models())

