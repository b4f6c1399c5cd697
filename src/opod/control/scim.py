"""SCIM 2.0 provisioning (RFC 7643, RFC 7644) at ``/scim/v2``, on the public listener.

An identity provider (Entra ID, Okta, Keycloak, JumpCloud) calls it from outside to keep opod's people
in step. ``/Users`` are people: any ``userName``, the email taken from ``emails``; ``active: false``
disables a person and their keys are refused on ``/v1`` from the next request on; ``DELETE`` disables
them too, keeping the record for the audit, and takes them out of SCIM's view and of every group.
``/Groups`` are the provider's own groups, by any name, kept with their members; the cluster
settings' ``auth.scim_groups`` maps a group name to the organization, team or project its members
join (:mod:`opod.control.scim_directory`). That mapping is the only rule: a group named like a path
(``acme/ml``) grants nothing unless the mapping names it, so no provider's naming grants by accident.
A change of the mapping applies at once (:meth:`_Scim.follow_settings`).

The bearer token is the stored secret ``auth/scim-token`` (``PUT /api/v1/auth/secrets/scim-token``);
without one SCIM is off and answers 404. Every answer is ``application/scim+json``; every refusal,
an unknown path or method included, a SCIM ``Error``; every change, and every refused one, is
audited as the actor ``scim``.

It lives in ``control`` because it changes what the management API manages, through the same
writers (:class:`opod.access.people.People`); the leader mounts its routes on the public
listener, beside ``/admin/v1``, since ``gateway`` may not import ``control``.

This module is the door (the token, refusals, the audit of refused changes) and what follows the
settings; what answers past the door (:mod:`opod.control.scim_resources`) is imported at the first
call let in, as ``scim2_models`` is slow to import and most leaders never see a SCIM call.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.access.people import People
from opod.access.secrets import AuthSecrets
from opod.access.tenancy import Tenancy
from opod.control.scim_wire import MEDIA_TYPE, PREFIX, ScimError
from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings
from opod.store import Store
from opod.store.audit import SOURCE_API, AuditDraft, AuditRow
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError
from opod.store.offloop import run_sync

if TYPE_CHECKING:
    from opod.control.scim_resources import Resources

log = logging.getLogger("opod.scim")

ACTOR = "scim"
_WRITES = ("POST", "PUT", "PATCH", "DELETE")
_ANY = ["GET", "HEAD", *_WRITES, "OPTIONS"]
"""Every route takes every method, so one it does not answer is refused as a SCIM error, not Starlette's 405."""


@dataclass(frozen=True, slots=True)
class _Call:
    """One SCIM call once the token was accepted: where it came from, and its audit draft (actor ``scim``)."""

    request: Request
    base: str
    draft: AuditDraft

    @classmethod
    def of(cls, request: Request) -> _Call:
        action = f"{request.method} {request.url.path}"
        target = request.path_params.get("id", "")
        return cls(
            request,
            f"{request.url.scheme}://{request.url.netloc}{PREFIX}",
            AuditDraft(actor=ACTOR, source=SOURCE_API, action=action, target=target),
        )


def routes(
    people: People, tenancy: Tenancy, secrets: AuthSecrets, store: Store, settings: SettingsHolder
) -> list[Route]:
    """The SCIM routes, for the public listener: people and groups changed through ``people``, the groups' grants
    from ``settings`` resolved in ``tenancy``, the bearer token from ``secrets``, refused changes in ``store``'s audit.
    The last route answers every other path under the prefix with a SCIM error."""
    scim = _Scim(people, tenancy, secrets, store, settings)
    settings.subscribe(scim.follow_settings)
    table: list[tuple[str, tuple[str, ...], Handler]] = [
        ("/Users", ("GET", "POST"), lambda r, c: r.directory.users(c.request, c.draft, c.base)),
        ("/Users/.search", ("POST",), lambda r, c: r.search_users(c.request, c.draft, c.base)),
        ("/Users/{id}", ("GET", "PUT", "PATCH", "DELETE"), lambda r, c: r.directory.user(c.request, c.draft, c.base)),
        ("/Groups", ("GET", "POST"), lambda r, c: r.directory.groups(c.request, c.draft, c.base)),
        ("/Groups/.search", ("POST",), lambda r, c: r.search_groups(c.request, c.draft, c.base)),
        ("/Groups/{id}", ("GET", "PUT", "PATCH", "DELETE"), lambda r, c: r.directory.group(c.request, c.draft, c.base)),
        ("/.search", ("POST",), lambda r, c: r.search_all(c.request, c.base)),
        ("/ServiceProviderConfig", ("GET",), lambda r, c: r.service_provider_config(c.base)),
        ("/ResourceTypes", ("GET",), lambda r, c: r.resource_types(c.request, c.base)),
        ("/ResourceTypes/{id}", ("GET",), lambda r, c: r.resource_types(c.request, c.base)),
        ("/Schemas", ("GET",), lambda r, c: r.schemas(c.request, c.base)),
        ("/Schemas/{id:path}", ("GET",), lambda r, c: r.schemas(c.request, c.base)),
    ]
    found = [Route(f"{PREFIX}{path}", scim.guard(h, methods), methods=_ANY) for path, methods, h in table]
    found.append(Route(PREFIX, scim.guard(_unknown, ()), methods=_ANY))
    found.append(Route(f"{PREFIX}/{{rest:path}}", scim.guard(_unknown, ()), methods=_ANY))
    return found


Handler = Callable[["Resources", _Call], Awaitable[Response]]
"""An answer past the door, from SCIM's resources."""


def _unknown(resources: Resources, call: _Call) -> Awaitable[Response]:
    return resources.unknown(call.request)


class _Scim:
    def __init__(
        self, people: People, tenancy: Tenancy, secrets: AuthSecrets, store: Store, settings: SettingsHolder
    ) -> None:
        self.people = people
        self.tenancy = tenancy
        self.secrets = secrets
        self.store = store
        self.settings = settings
        self._resources: Resources | None = None
        self._mapping = settings.current.auth.scim_groups
        self._syncing: set[asyncio.Task[None]] = set()

    async def resources(self) -> Resources:
        """What answers past the door, imported at the first call let in (``scim2_models`` is slow to import), in a
        thread: the requests in flight on the event loop do not wait for it."""
        if self._resources is None:
            module = await asyncio.to_thread(importlib.import_module, "opod.control.scim_resources")
            if self._resources is None:  # two first calls: the one that comes back first makes it
                self._resources = module.Resources(self.people, self.tenancy, self.settings, self.store)
        return self._resources

    # --- the door: the token, refusals as SCIM errors, refused changes audited ----------------

    def guard(self, handler: Handler, methods: tuple[str, ...]) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the token, for ``methods`` (HEAD with GET); every other method a SCIM 405."""
        allowed = (*methods, "HEAD") if "GET" in methods else methods

        async def endpoint(request: Request) -> Response:
            call: _Call | None = None
            try:
                await self._authenticate(request)
                call = _Call.of(request)
                if methods and request.method not in allowed:
                    raise ScimError(405, f"{request.method} is not answered here; use {', '.join(methods)}")
                return await (await self.resources()).answer(handler, call)
            except ScimError as err:  # scim2's own refusals too, raised as these by Resources.answer
                refused = err
            except (InvalidInput, ValidationError) as err:
                refused = ScimError(400, str(err), "invalidValue")
            except Conflict as err:
                refused = ScimError(409, str(err), "uniqueness")
            except NotFound as err:
                refused = ScimError(404, str(err))
            except StoreError as err:
                refused = ScimError(503, f"the store failed: {err}; retry shortly")
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                refused = ScimError(500, f"{request.method} {request.url.path} failed on the leader; its log says why")
            if request.method in _WRITES and (call is None or not call.draft.committed):
                await self._record_refusal(call or _Call.of(request), refused)
            await self.resources()  # a refusal's body is scim2's Error too: its module imported off the loop first
            return refused.response()

        return endpoint

    async def _authenticate(self, request: Request) -> None:
        token = await self.secrets.scim_token()
        if token is None:
            raise ScimError(
                404,
                "SCIM provisioning is off on this fleet: no SCIM token is set; an operator sets one with "
                "PUT /api/v1/auth/secrets/scim-token",
            )
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ScimError(
                401, "send the SCIM token as Authorization: Bearer TOKEN (the secret auth/scim-token the operator set)"
            )

    async def _record_refusal(self, call: _Call, err: ScimError) -> None:
        call.draft.body = {"refused": err.detail}
        try:
            await run_sync(self.store.record_audit, call.draft.after(err.status))
        except StoreError as failure:
            log.error("could not record the audit row of %s: %s", call.draft.action, failure)

    # --- what the groups grant, when the settings' mapping changes ----------------------------

    def follow_settings(self, settings: ClusterSettings) -> None:
        """On a new settings version (on the event loop): when ``auth.scim_groups`` changed, bring the memberships
        SCIM groups grant in line with it, in the background."""
        mapping = settings.auth.scim_groups
        if mapping == self._mapping:
            return
        self._mapping = mapping
        try:
            task = asyncio.get_running_loop().create_task(self.sync_grants())
        except RuntimeError:  # no loop yet (the first read at start): nothing was granted under another mapping
            return
        self._syncing.add(task)
        task.add_done_callback(self._syncing.discard)

    async def sync_grants(self) -> None:
        # scim_directory imports scim2_models (slow to import): once the mapping changed, and in a thread.
        grants = (await asyncio.to_thread(importlib.import_module, "opod.control.scim_directory")).grants
        row = AuditRow(
            actor=ACTOR,
            source=SOURCE_API,
            action="sync auth.scim_groups",
            target="settings:auth.scim_groups",
            detail="memberships granted by SCIM groups brought in line with the settings",
            status=200,
        )
        try:
            change = await self.people.sync_grants(grants(self.settings, self.tenancy), audit=row)
        except StoreError as err:
            log.error("SCIM groups' memberships not brought in line with auth.scim_groups: %s", err)
            return
        if change.added or change.removed:
            log.info(
                "auth.scim_groups applied: %d memberships made, %d taken back, %d keys revoked",
                len(change.added),
                len(change.removed),
                len(change.revoked),
            )


__all__ = ["MEDIA_TYPE", "PREFIX", "ScimError", "routes"]
