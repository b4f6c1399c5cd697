"""SCIM's ``/Users`` and ``/Groups``: people and groups as identity providers write and read them.

A User's ``userName`` is any text; the person's email comes from ``emails`` (the primary one first).
What the provider sent is kept whole and read back as sent, with opod's own ``id``, ``active``,
``groups`` and ``meta`` over it. A Group is the provider's own, by any name; the mapping
``auth.scim_groups`` of the cluster settings decides which organization, team or project its
members join (read by :meth:`opod.access.group_rules.GroupRules.for_scim`, the rule OIDC and LDAP
follow too), and a group it does not name is kept and grants nothing: its audit rows say so, and a
warning names it in the leader's log. A membership a group granted is taken
back when the person leaves the group, the group is deleted, renamed out of the mapping, or the
mapping changes; one an operator made is never touched.
"""

from __future__ import annotations

import logging
from typing import Any

from scim2_models import Context, EnterpriseUser, Group, PatchOp, User
from starlette.requests import Request
from starlette.responses import Response

from opod.access.group_rules import GroupRules
from opod.access.people import People
from opod.access.tenancy import Tenancy
from opod.control.scim_wire import (
    ScimError,
    audit_fields,
    page,
    read_body,
    scim_response,
    search_request,
    user_fields,
)
from opod.settings.holder import SettingsHolder
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import NotFound
from opod.store.offloop import run_sync
from opod.store.people import MembershipsMatched, UserRecord, new_user_id
from opod.store.scim import ScimGroupRecord, ScimUserRecord, new_group_id

log = logging.getLogger("opod.scim")

ScimUser = User[EnterpriseUser]
"""A User as providers send it, the enterprise extension (department, manager, ...) included."""


def grants(settings: SettingsHolder, tenancy: Tenancy) -> GroupRules:
    """``auth.scim_groups`` as it is in force, read into the one rule of what groups grant."""
    return GroupRules.for_scim(settings.current.auth.scim_groups, tenancy)


class Directory:
    """The Users and Groups a provider provisions, written through ``people`` (the one writer of people)."""

    def __init__(self, people: People, tenancy: Tenancy, settings: SettingsHolder, store: Store) -> None:
        self.people = people
        self.tenancy = tenancy
        self.settings = settings
        self.store = store

    # --- /Users ------------------------------------------------------------------------------------

    async def users(self, request: Request, draft: AuditDraft, base: str, search: Any = None) -> Response:
        if request.method == "POST" and search is None:
            given = await read_body(request, ScimUser, Context.RESOURCE_CREATION_REQUEST)
            fields = user_fields(given)
            holder = self.people.user(fields["email"])
            user_id = holder.id if holder is not None else new_user_id()
            if await run_sync(self.store.scim_user_by_name, fields["user_name"]) is not None:
                raise ScimError(
                    409, f"userName {fields['user_name']!r} is someone's already; PUT or PATCH /Users/ID", "uniqueness"
                )
            with draft.commit(target=f"user:{user_id}", detail=audit_fields(fields), status=201) as row:
                person, kept = await self.people.provision(
                    user_id=user_id, document=_document(given), create=True, audit=row, **fields
                )
            resource = self._user(person, kept, [], base)
            return scim_response(_dump(resource), 201, {"Location": f"{base}/Users/{person.id}"})
        search = search or search_request(request, ScimUser)
        return scim_response(page(search, _matching(search, await self.all_users(base)), ScimUser))

    async def all_users(self, base: str) -> list[ScimUser]:
        kept_all = await run_sync(self.store.scim_users)
        memberships: dict[str, list[ScimGroupRecord]] = {}
        for group in await run_sync(self.store.scim_groups):
            for member, _ in group.members:
                memberships.setdefault(member, []).append(group)
        found = []
        for kept in kept_all:
            held = self.people.user(kept.user_id)
            if held is not None:
                found.append(self._user(held, kept, memberships.get(held.id, []), base))
        return found

    async def user(self, request: Request, draft: AuditDraft, base: str) -> Response:
        user_id = request.path_params["id"]
        kept = await run_sync(self.store.scim_user, user_id)
        person = self.people.user(user_id)
        if kept is None or person is None or person.id != user_id:
            raise ScimError(404, f"no User {user_id!r}; GET /scim/v2/Users lists them")
        if request.method == "DELETE":
            with draft.commit(target=f"user:{user_id}", detail={"deleted": True}, status=204) as row:
                await self.people.unprovision(user_id, grants=grants(self.settings, self.tenancy), audit=row)
            return Response(status_code=204)
        current = self._user(person, kept, await run_sync(self.store.scim_groups_of, user_id), base)
        if request.method == "GET":
            return scim_response(_dump(current, request))
        if request.method == "PUT":
            given = await read_body(request, ScimUser, Context.RESOURCE_REPLACEMENT_REQUEST)
        else:
            patch = await read_body(request, PatchOp[ScimUser], Context.RESOURCE_PATCH_REQUEST)
            given = current.model_copy(deep=True)
            patch.patch(given)
        fields = user_fields(given)
        with draft.commit(target=f"user:{user_id}", detail=audit_fields(fields), status=200) as row:
            person, kept = await self.people.provision(
                user_id=user_id, document=_document(given), create=False, audit=row, **fields
            )
        return scim_response(_dump(self._user(person, kept, await run_sync(self.store.scim_groups_of, user_id), base)))

    def _user(self, person: UserRecord, kept: ScimUserRecord, groups: list[ScimGroupRecord], base: str) -> ScimUser:
        data = dict(kept.document)
        if person.state == "disabled" or "active" in data:
            data["active"] = person.state != "disabled"  # whoever changed it last, the provider reads it
        data.update(
            id=person.id,
            userName=kept.user_name,
            meta={
                "resourceType": "User",
                "created": person.created_at.isoformat(),
                "lastModified": kept.updated_at.isoformat(),
                "location": f"{base}/Users/{person.id}",
                "version": f'W/"{kept.version}"',
            },
        )
        data["groups"] = [
            {"value": g.id, "display": g.display_name, "$ref": f"{base}/Groups/{g.id}", "type": "direct"}
            for g in groups
        ] or None
        return ScimUser.model_validate(
            {k: v for k, v in data.items() if v is not None}, scim_ctx=Context.RESOURCE_QUERY_RESPONSE
        )

    # --- /Groups -----------------------------------------------------------------------------------

    async def groups(self, request: Request, draft: AuditDraft, base: str, search: Any = None) -> Response:
        if request.method == "POST" and search is None:
            given = await read_body(request, Group, Context.RESOURCE_CREATION_REQUEST)
            group, _ = await self._write(draft, new_group_id(), given, create=True)
            return scim_response(_dump(self._group(group, base)), 201, {"Location": f"{base}/Groups/{group.id}"})
        search = search or search_request(request, Group)
        return scim_response(page(search, _matching(search, await self.all_groups(base)), Group))

    async def all_groups(self, base: str) -> list[Group]:
        return [self._group(g, base) for g in await run_sync(self.store.scim_groups)]

    async def group(self, request: Request, draft: AuditDraft, base: str) -> Response:
        group_id = request.path_params["id"]
        group = await run_sync(self.store.scim_group, group_id)
        if group is None:
            raise ScimError(404, f"no Group {group_id!r}; GET /scim/v2/Groups lists them")
        if request.method == "GET":
            return scim_response(_dump(self._group(group, base), request))
        if request.method == "DELETE":
            detail = {"displayName": group.display_name, "deleted": True}
            with draft.commit(target=f"group:{group_id}", detail=detail, status=204) as row:
                await self.people.delete_group(group_id, grants=grants(self.settings, self.tenancy), audit=row)
            return Response(status_code=204)
        if request.method == "PUT":
            given = await read_body(request, Group, Context.RESOURCE_REPLACEMENT_REQUEST)
        else:
            patch = await read_body(request, PatchOp[Group], Context.RESOURCE_PATCH_REQUEST)
            given = self._group(group, base)
            patch.patch(given)
        group, _ = await self._write(draft, group_id, given, create=False)
        return scim_response(_dump(self._group(group, base)))

    async def _write(
        self, draft: AuditDraft, group_id: str, given: Group, *, create: bool
    ) -> tuple[ScimGroupRecord, MembershipsMatched]:
        name = (given.display_name or "").strip()
        if not name:
            raise ScimError(400, "displayName: a Group needs one (the name the provider knows it by)", "invalidValue")
        members: dict[str, str] = {}
        for member in given.members or []:
            if member.type not in (None, "User") or not member.value:
                raise ScimError(
                    400,
                    f"members: {member.value!r} is not a User; opod's groups hold people, not other groups",
                    "invalidValue",
                )
            members[member.value] = member.display or ""
        rules = grants(self.settings, self.tenancy)
        grant = rules.granted(name)
        if grant.startswith("nothing"):
            log.warning("SCIM group %r (%s) grants %s", name, group_id, grant)
        detail = {"displayName": name, "members": len(members), "grants": grant}
        with draft.commit(target=f"group:{group_id}", detail=detail, status=201 if create else 200) as row:
            try:
                return await self.people.put_group(
                    group_id,
                    display_name=name,
                    external_id=given.external_id or "",
                    document=_document(given),
                    members=members,
                    create=create,
                    grants=rules,
                    audit=row,
                )
            except NotFound as err:  # a member SCIM did not provision: the provider's mistake, not a missing group
                raise ScimError(400, str(err), "invalidValue") from None

    def _display(self, user_id: str) -> str | None:
        person = self.people.user(user_id)
        return person.email if person is not None else None

    def _group(self, group: ScimGroupRecord, base: str) -> Group:
        data = dict(group.document)
        data.update(
            id=group.id,
            displayName=group.display_name,
            meta={
                "resourceType": "Group",
                "created": group.created_at.isoformat(),
                "lastModified": group.updated_at.isoformat(),
                "location": f"{base}/Groups/{group.id}",
                "version": f'W/"{group.version}"',
            },
        )
        if group.external_id:
            data["externalId"] = group.external_id
        data["members"] = [
            {"value": u, "$ref": f"{base}/Users/{u}", "type": "User", "display": shown or self._display(u)}
            for u, shown in group.members
        ] or None
        return Group.model_validate(
            {k: v for k, v in data.items() if v is not None}, scim_ctx=Context.RESOURCE_QUERY_RESPONSE
        )


def _matching(search: Any, resources: list[Any]) -> list[Any]:
    return [r for r in resources if search.filter is None or search.filter.match(r)]


def _document(resource: Any) -> dict[str, Any]:
    """What is kept of a resource as sent: everything a reader may see again (never a password), less what opod
    answers itself."""
    kept: dict[str, Any] = resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE)
    for own in ("id", "meta", "groups", "members", "userName"):
        kept.pop(own, None)
    return kept


def _dump(resource: Any, request: Request | None = None) -> dict[str, Any]:
    """A resource as an answer, with only the attributes the request asks for (``attributes``, ``excludedAttributes``)."""
    wanted = None
    if request is not None:
        wanted = search_request(request, type(resource))
    dumped: dict[str, Any] = resource.model_dump(scim_ctx=Context.RESOURCE_QUERY_RESPONSE, response_parameters=wanted)
    return dumped
