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
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    Context,
    EnterpriseUser,
    ETag,
    Filter,
    Group,
    Meta,
    Patch,
    Required,
    ResourceType,
    Schema,
    SchemaExtension,
    SCIMException,
    ServiceProviderConfig,
    Sort,
    User,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.access.people import People
from opod.access.secrets import AuthSecrets
from opod.access.tenancy import Tenancy
from opod.control.scim_directory import Directory, ScimUser, grants
from opod.control.scim_wire import (
    MEDIA_TYPE,
    PAGE_MAX,
    PREFIX,
    ScimError,
    one_or_list,
    page,
    read_json,
    scim_response,
    search_request,
)
from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings
from opod.store import Store
from opod.store.audit import SOURCE_API, AuditDraft, AuditRow
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError
from opod.store.offloop import run_sync

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
    scim = _Scim(Directory(people, tenancy, settings, store), secrets, store)
    settings.subscribe(scim.follow_settings)
    directory = scim.directory
    table: list[tuple[str, tuple[str, ...], Handler]] = [
        ("/Users", ("GET", "POST"), lambda c: directory.users(c.request, c.draft, c.base)),
        ("/Users/.search", ("POST",), scim.search_users),
        ("/Users/{id}", ("GET", "PUT", "PATCH", "DELETE"), lambda c: directory.user(c.request, c.draft, c.base)),
        ("/Groups", ("GET", "POST"), lambda c: directory.groups(c.request, c.draft, c.base)),
        ("/Groups/.search", ("POST",), scim.search_groups),
        ("/Groups/{id}", ("GET", "PUT", "PATCH", "DELETE"), lambda c: directory.group(c.request, c.draft, c.base)),
        ("/.search", ("POST",), scim.search_all),
        ("/ServiceProviderConfig", ("GET",), scim.service_provider_config),
        ("/ResourceTypes", ("GET",), scim.resource_types),
        ("/ResourceTypes/{id}", ("GET",), scim.resource_types),
        ("/Schemas", ("GET",), scim.schemas),
        ("/Schemas/{id:path}", ("GET",), scim.schemas),
    ]
    found = [Route(f"{PREFIX}{path}", scim.guard(h, methods), methods=_ANY) for path, methods, h in table]
    found.append(Route(PREFIX, scim.guard(scim.unknown, ()), methods=_ANY))
    found.append(Route(f"{PREFIX}/{{rest:path}}", scim.guard(scim.unknown, ()), methods=_ANY))
    return found


Handler = Callable[[_Call], Awaitable[Response]]


class _Scim:
    def __init__(self, directory: Directory, secrets: AuthSecrets, store: Store) -> None:
        self.directory = directory
        self.secrets = secrets
        self.store = store
        self._mapping = directory.settings.current.auth.scim_groups
        self._syncing: set[asyncio.Task[None]] = set()

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
                return await handler(call)
            except ScimError as err:
                refused = err
            except SCIMException as err:  # a patch path that reaches nothing, a mutability rule
                where = err.context.get("path")
                refused = ScimError(
                    err.status, err.detail + (f" (path {where})" if where else ""), err.scim_type or None
                )
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

    async def unknown(self, call: _Call) -> Response:
        path = call.request.url.path
        raise ScimError(
            404, f"no such path: {call.request.method} {path}; SCIM answers /Users, /Groups and the discovery paths"
        )

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
        directory = self.directory
        row = AuditRow(
            actor=ACTOR,
            source=SOURCE_API,
            action="sync auth.scim_groups",
            target="settings:auth.scim_groups",
            detail="memberships granted by SCIM groups brought in line with the settings",
            status=200,
        )
        try:
            change = await directory.people.sync_grants(grants(directory.settings, directory.tenancy), audit=row)
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

    # --- searches by POST (RFC 7644 3.4.3) ----------------------------------------------------

    async def search_users(self, call: _Call) -> Response:
        body = await read_json(call.request)
        return await self.directory.users(call.request, call.draft, call.base, _searching(call.request, User, body))

    async def search_groups(self, call: _Call) -> Response:
        body = await read_json(call.request)
        return await self.directory.groups(call.request, call.draft, call.base, _searching(call.request, Group, body))

    async def search_all(self, call: _Call) -> Response:
        search = search_request(call.request, ScimUser | Group, await read_json(call.request))
        found = await self.directory.all_users(call.base) + await self.directory.all_groups(call.base)
        return scim_response(
            page(search, [r for r in found if search.filter is None or search.filter.match(r)], ScimUser | Group)
        )

    # --- discovery ---------------------------------------------------------------------------------

    async def service_provider_config(self, call: _Call) -> Response:
        config = ServiceProviderConfig(
            documentation_uri="https://github.com/opod/opod",
            patch=Patch(supported=True),
            bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
            filter=Filter(supported=True, max_results=PAGE_MAX),
            change_password=ChangePassword(supported=False),
            sort=Sort(supported=False),
            etag=ETag(supported=False),
            authentication_schemes=[
                AuthenticationScheme(
                    type="oauthbearertoken",
                    name="Bearer token",
                    primary=True,
                    description="The SCIM token an operator stored with PUT /api/v1/auth/secrets/scim-token",
                )
            ],
            meta=Meta(resource_type="ServiceProviderConfig", location=f"{call.base}/ServiceProviderConfig"),
        )
        return scim_response(config.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE))

    async def resource_types(self, call: _Call) -> Response:
        types: dict[str, dict[str, Any]] = {}
        for model in (User, Group):
            kind = ResourceType.from_resource(model)
            if model is User:
                kind.schema_extensions = [SchemaExtension(schema_=EnterpriseUser.__schema__, required=False)]
            kind.meta = Meta(resource_type="ResourceType", location=f"{call.base}/ResourceTypes/{kind.id}")
            types[str(kind.id)] = kind.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        return one_or_list(call.request, types, "ResourceType", ResourceType)

    async def schemas(self, call: _Call) -> Response:
        found = {}
        for model in (User, Group, EnterpriseUser):
            schema = model.to_schema()
            if model is User:
                _required(schema, "emails", "value")
            schema.meta = Meta(resource_type="Schema", location=f"{call.base}/Schemas/{schema.id}")
            found[str(schema.id)] = schema.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        return one_or_list(call.request, found, "Schema", Schema)


def _required(schema: Schema, name: str, inner: str) -> None:
    """Mark ``name`` and its ``inner`` sub-attribute required: opod needs a person's email (RFC 7643 7 lets a service
    provider publish what it requires), though it takes one from a userName that is an address."""
    for attribute in schema.attributes or []:
        if attribute.name == name:
            attribute.required = Required.true
            for sub in attribute.sub_attributes or []:
                if sub.name == inner:
                    sub.required = Required.true


def _searching(request: Request, model: Any, body: dict[str, Any]) -> Any:
    return search_request(request, ScimUser if model is User else model, body)


__all__ = ["MEDIA_TYPE", "PREFIX", "ScimError", "routes"]
