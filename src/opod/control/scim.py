"""SCIM 2.0 provisioning (RFC 7643, RFC 7644) at ``/scim/v2``, on the public listener.

An identity provider (Entra ID, Okta, Keycloak) calls it from outside to keep opod's people in
step: ``/Users`` are people (``userName`` is the email), ``/Groups`` are the teams and projects of
the tenancy tree, named by their path (``acme/ml``, ``acme/ml/chat``), whose members become
memberships. ``active: false`` disables a person and their keys are refused on ``/v1`` from the
next request on; ``DELETE`` disables too, keeping the record for the audit. The bearer token is
the stored secret ``auth/scim-token`` (``PUT /api/v1/auth/secrets/scim-token``); without one SCIM
is off and answers 404. Every answer is ``application/scim+json``; every refusal a SCIM ``Error``;
every change is audited as the actor ``scim``.

It lives in ``control`` because it changes what the management API manages, through the same
writers (:class:`opod.access.people.People`); the leader mounts its routes on the public
listener, beside ``/admin/v1``, since ``gateway`` may not import ``control``.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    Context,
    Email,
    EnterpriseUser,
    ETag,
    Extension,
    Filter,
    Group,
    GroupMember,
    GroupMembership,
    Meta,
    Name,
    Patch,
    PatchOp,
    ResourceType,
    Schema,
    SCIMException,
    ServiceProviderConfig,
    Sort,
    User,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.access.people import People
from opod.access.scopes import Scope, ScopeKind, id_kind
from opod.access.secrets import AuthSecrets
from opod.access.tenancy import Tenancy
from opod.control.scim_wire import (
    GROUP_FILTERS,
    MEDIA_TYPE,
    PAGE_MAX,
    PREFIX,
    USER_FILTERS,
    ScimError,
    audit_fields,
    matches,
    one_or_list,
    page,
    read_body,
    read_filter,
    scim_response,
    user_fields,
)
from opod.store import Store
from opod.store.audit import SOURCE_API, AuditDraft
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError
from opod.store.offloop import run_sync
from opod.store.people import UserRecord, new_user_id

log = logging.getLogger("opod.scim")

ACTOR = "scim"

ScimUser = User[EnterpriseUser]
"""A User as providers send it: the enterprise extension (department, manager, ...) is read and not kept."""

_MEMBER_PATH = re.compile(r'^members\[\s*value\s+eq\s+"([^"]+)"\s*\]$', re.IGNORECASE)


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


def routes(people: People, tenancy: Tenancy, secrets: AuthSecrets, store: Store) -> list[Route]:
    """The SCIM routes, for the public listener: people changed through ``people``, groups read from ``tenancy``,
    the bearer token from ``secrets``, refused changes recorded in ``store``'s audit."""
    scim = _Scim(people, tenancy, secrets, store)
    return [
        Route(f"{PREFIX}/Users", scim.guard(scim.users), methods=["GET", "POST"]),
        Route(f"{PREFIX}/Users/{{id}}", scim.guard(scim.user), methods=["GET", "PUT", "PATCH", "DELETE"]),
        Route(f"{PREFIX}/Groups", scim.guard(scim.groups), methods=["GET", "POST"]),
        Route(f"{PREFIX}/Groups/{{id}}", scim.guard(scim.group), methods=["GET", "PUT", "PATCH", "DELETE"]),
        Route(f"{PREFIX}/ServiceProviderConfig", scim.guard(scim.service_provider_config), methods=["GET"]),
        Route(f"{PREFIX}/ResourceTypes", scim.guard(scim.resource_types), methods=["GET"]),
        Route(f"{PREFIX}/ResourceTypes/{{id}}", scim.guard(scim.resource_types), methods=["GET"]),
        Route(f"{PREFIX}/Schemas", scim.guard(scim.schemas), methods=["GET"]),
        Route(f"{PREFIX}/Schemas/{{id}}", scim.guard(scim.schemas), methods=["GET"]),
    ]


Handler = Callable[[_Call], Awaitable[Response]]


class _Scim:
    def __init__(self, people: People, tenancy: Tenancy, secrets: AuthSecrets, store: Store) -> None:
        self._people = people
        self.tenancy = tenancy
        self.secrets = secrets
        self.store = store

    # --- the door: the token, the body cap, refusals as SCIM errors, refused changes audited -----

    def guard(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            call: _Call | None = None
            try:
                await self._authenticate(request)
                call = _Call.of(request)
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
            if call is not None and request.method != "GET" and not call.draft.committed:
                await self._record_refusal(call, refused)
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

    def people(self) -> People:
        return self._people

    # --- /Users ----------------------------------------------------------------------------------

    async def users(self, call: _Call) -> Response:
        people = self.people()
        if call.request.method == "POST":
            given = await read_body(call.request, ScimUser, Context.RESOURCE_CREATION_REQUEST)
            fields = user_fields(given)
            if people.user(fields["email"]) is not None:
                raise ScimError(
                    409,
                    f"userName {fields['email']!r} is someone's already; PUT or PATCH /Users/ID changes them",
                    "uniqueness",
                )
            user_id = new_user_id()
            with call.draft.commit(target=f"user:{user_id}", detail=audit_fields(fields), status=201) as row:
                user = await people.create(id=user_id, audit=row, **fields)
            return scim_response(self.user_resource(user, call.base), 201, {"Location": f"{call.base}/Users/{user.id}"})
        wanted = read_filter(call.request, USER_FILTERS)
        found = [u for u in people.users() if matches(wanted, u)]
        return scim_response(page(call.request, [self.user_resource(u, call.base) for u in found], User))

    async def user(self, call: _Call) -> Response:
        people = self.people()
        user = people.user(call.request.path_params["id"])
        if user is None or user.id != call.request.path_params["id"]:  # a User is addressed by its id alone
            raise ScimError(404, f"no User {call.request.path_params['id']!r}; GET /scim/v2/Users lists them")
        method = call.request.method
        if method == "GET":
            return scim_response(self.user_resource(user, call.base))
        if method == "DELETE":
            with call.draft.commit(target=f"user:{user.id}", detail={"active": False}, status=204) as row:
                await people.update(user.id, state="disabled", audit=row)
            return Response(status_code=204)
        if method == "PUT":
            fields = user_fields(await read_body(call.request, ScimUser, Context.RESOURCE_REPLACEMENT_REQUEST))
        else:
            patch = await read_body(call.request, PatchOp[ScimUser], Context.RESOURCE_PATCH_REQUEST)
            before: ScimUser = ScimUser.model_validate(
                self.user_resource(user, call.base), scim_ctx=Context.RESOURCE_QUERY_RESPONSE
            )
            current = before.model_copy(deep=True)
            try:
                patch.patch(current)
            except ValueError as err:
                raise ScimError(400, f"the patch does not apply: {err}", "invalidValue") from None
            fields = user_fields(current, before)
        with call.draft.commit(target=f"user:{user.id}", detail=audit_fields(fields), status=200) as row:
            changed = await people.update(user.id, audit=row, **fields)
        return scim_response(self.user_resource(changed, call.base))

    def user_resource(self, user: UserRecord, base: str) -> dict[str, Any]:
        people = self.people()
        groups = [
            GroupMembership(value=m.target, display=self._path(m.target), ref=f"{base}/Groups/{m.target}")
            for m in people.memberships(user.id)
            if self._group_kind(m.target)
        ]
        resource: User[Extension] = User(
            id=user.id,
            external_id=user.external_id or None,
            user_name=user.email,
            display_name=user.name or None,
            name=Name(formatted=user.name) if user.name else None,
            active=user.state != "disabled",
            emails=[Email(value=user.email, primary=True)],
            groups=groups or None,
            meta=Meta(resource_type="User", created=user.created_at, location=f"{base}/Users/{user.id}"),
        )
        return resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)

    # --- /Groups: teams and projects by path ------------------------------------------------------

    async def groups(self, call: _Call) -> Response:
        if call.request.method == "POST":
            given = await read_body(call.request, Group, Context.RESOURCE_CREATION_REQUEST)
            scope = self._group_by_path(given.display_name or "")
            members = self._member_ids([m.value or "" for m in given.members or []])
            detail = {"displayName": given.display_name, "add": members}
            with call.draft.commit(target=scope.text, detail=detail, status=201) as row:
                await self.people().change_members(scope.id, add=members, by=ACTOR, audit=row)
            return scim_response(
                self.group_resource(scope, call.base), 201, {"Location": f"{call.base}/Groups/{scope.id}"}
            )
        wanted = read_filter(call.request, GROUP_FILTERS)
        scopes = self._all_groups()
        if wanted is not None:
            attribute, value = wanted
            scopes = [s for s in scopes if (s.id if attribute == "id" else self._path(s.id)) == value]
        # Providers ask for groups without their members when they only look one up (excludedAttributes=members).
        bare = "members" in call.request.query_params.get("excludedAttributes", "").lower().split(",")
        return scim_response(
            page(call.request, [self.group_resource(s, call.base, members=not bare) for s in scopes], Group)
        )

    async def group(self, call: _Call) -> Response:
        group_id = call.request.path_params["id"]
        kind = self._group_kind(group_id)
        if kind is None:
            raise ScimError(
                404, f"no Group {group_id!r}: groups are the teams and projects; GET /scim/v2/Groups lists them"
            )
        scope = Scope(kind, group_id)
        method = call.request.method
        if method == "GET":
            return scim_response(self.group_resource(scope, call.base))
        if method == "DELETE":
            # Those who leave lose their keys in projects they no longer reach, in the same transaction.
            with call.draft.commit(target=scope.text, detail={"members": "all removed"}, status=204) as row:
                await self.people().change_members(scope.id, replace_all=True, by=ACTOR, audit=row)
            return Response(status_code=204)
        if method == "PUT":
            given = await read_body(call.request, Group, Context.RESOURCE_REPLACEMENT_REQUEST)
            self._same_name(scope, given.display_name)
            add, remove, replace_all = self._member_ids([m.value or "" for m in given.members or []]), list[str](), True
        else:
            patch = await read_body(call.request, PatchOp[Group], Context.RESOURCE_PATCH_REQUEST)
            add, remove, replace_all = self._group_patch(scope, patch)
        detail = {"add": add, "remove": remove, "replace": replace_all}
        with call.draft.commit(target=scope.text, detail=detail, status=200) as row:
            await self.people().change_members(
                scope.id, add=add, remove=remove, replace_all=replace_all, by=ACTOR, audit=row
            )
        return scim_response(self.group_resource(scope, call.base))

    def _group_patch(self, scope: Scope, patch: PatchOp[Group]) -> tuple[list[str], list[str], bool]:
        """The members a patch adds and removes; ``replace`` of members replaces them whole."""
        add: list[str] = []
        remove: list[str] = []
        replace_all = False
        for operation in patch.operations or []:
            op = str(operation.op.value if hasattr(operation.op, "value") else operation.op).lower()
            path = str(operation.path or "")
            value = operation.value
            if not path and isinstance(value, dict):
                if "displayName" in value:
                    self._same_name(scope, value["displayName"])
                if "members" in value:
                    path, value = "members", value["members"]
                else:
                    continue
            if path.lower() == "displayname":
                self._same_name(scope, value if isinstance(value, str) else None)
                continue
            single = _MEMBER_PATH.match(path)
            if single is not None and op == "remove":
                remove.append(single.group(1))
                continue
            if path.lower() != "members":
                raise ScimError(
                    400,
                    f'path {path!r}: a group\'s members change through path members (or members[value eq "ID"])',
                    "invalidPath",
                )
            ids = [str(v.get("value", "")) for v in value] if isinstance(value, list) else []
            if op == "add":
                add += ids
            elif op == "remove":
                if not ids:
                    replace_all, add = True, []  # remove with no value: every member leaves
                remove += ids
            elif op == "replace":
                replace_all, add = True, ids
            else:
                raise ScimError(400, f"op {op!r} is not add, remove or replace", "invalidSyntax")
        return self._member_ids(add), remove, replace_all

    def group_resource(self, scope: Scope, base: str, *, members: bool = True) -> dict[str, Any]:
        people = self.people()
        shown = []
        for membership in people.members(scope.id) if members else []:
            person = people.user(membership.user_id)
            shown.append(
                GroupMember(
                    value=membership.user_id,
                    display=person.email if person else None,
                    ref=f"{base}/Users/{membership.user_id}",
                )
            )
        resource = Group(
            id=scope.id,
            display_name=self._path(scope.id),
            members=shown or None,
            meta=Meta(resource_type="Group", location=f"{base}/Groups/{scope.id}"),
        )
        return resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)

    def _all_groups(self) -> list[Scope]:
        tenancy = self.tenancy
        return [Scope("team", t.id) for t in tenancy.teams] + [Scope("project", p.id) for p in tenancy.projects]

    def _group_kind(self, target: str) -> ScopeKind | None:
        """``team`` or ``project`` when ``target`` is one's id (the groups SCIM sees), else None."""
        kind = id_kind(target)
        if kind not in ("team", "project"):
            return None
        try:
            return self.tenancy.resolve(target, kinds=(kind,)).kind
        except (NotFound, InvalidInput):
            return None

    def _group_by_path(self, path: str) -> Scope:
        depth = len(path.split("/")) if path else 0
        if depth not in (2, 3):
            raise ScimError(
                400,
                f"displayName {path!r}: a group is a team (ORG/TEAM) or a project (ORG/TEAM/PROJECT) by its path",
                "invalidValue",
            )
        kind = "team" if depth == 2 else "project"
        try:
            return self.tenancy.resolve(f"{kind}:{path}", kinds=(kind,), field="displayName")
        except NotFound as err:
            raise ScimError(
                400,
                f"{err}; an operator creates it first (POST /api/v1/{kind}s), then the provider pushes its members",
                "invalidValue",
            ) from None

    def _same_name(self, scope: Scope, name: str | None) -> None:
        if name is not None and name != self._path(scope.id):
            raise ScimError(
                400,
                f"displayName {name!r}: a group is named by its team's or project's path "
                f"({self._path(scope.id)}); rename it through /api/v1",
                "mutability",
            )

    def _member_ids(self, values: list[str]) -> list[str]:
        people = self.people()
        unknown = [v for v in values if people.user(v) is None or not v.startswith("usr_")]
        if unknown:
            raise ScimError(
                400,
                f"members: no User {', '.join(repr(u) for u in unknown)}; provision them through /Users first",
                "invalidValue",
            )
        return list(dict.fromkeys(values))

    def _path(self, target: str) -> str:
        kind = self._group_kind(target)
        if kind is None:
            return target
        return self.tenancy.scope_path(Scope(kind, target))

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
            kind.meta = Meta(resource_type="ResourceType", location=f"{call.base}/ResourceTypes/{kind.id}")
            types[str(kind.id)] = kind.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        return one_or_list(call.request, types, "ResourceType", ResourceType)

    async def schemas(self, call: _Call) -> Response:
        found = {}
        for model in (User, Group):
            schema = model.to_schema()
            schema.meta = Meta(resource_type="Schema", location=f"{call.base}/Schemas/{schema.id}")
            found[str(schema.id)] = schema.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
        return one_or_list(call.request, found, "Schema", Schema)


__all__ = ["MEDIA_TYPE", "PREFIX", "ScimError", "routes"]
