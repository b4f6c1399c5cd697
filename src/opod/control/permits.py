"""``/api/v1`` called with a session: what each operation needs (one table), and the check the admin listener makes.

A call with the admin key is not checked here: the key may do everything. A call with a session
cookie is allowed what the person may do (:class:`opod.access.permissions.Permissions`): each
operation's action comes from :data:`OPERATIONS` by its operation id, else from
:data:`BY_TAG` by its tag and whether it reads or changes. Where the action depends on the place
(keys, memberships) or on what changes (settings), :class:`SessionGate` reads it from the
request: the body's ``project``, ``user`` or ``target``, the key named in the path, the settings
sections a new body changes. ``tests/control/test_permits.py`` checks that every operation of
the spec and every route of the app has its action.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opod.access.permissions import Action, Permissions
from opod.access.service import AccessService
from opod.access.sessions import Sessions, SignedIn
from opod.access.tenancy import Tenancy
from opod.settings.service import SettingsService
from opod.settings.text import SettingsInvalid, parse_settings
from opod.store.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreError
from opod.store.people import UserRecord

READ, OPERATE, ADMINISTER = Action.READ, Action.OPERATE, Action.ADMINISTER

BY_TAG: dict[str, tuple[Action, Action]] = {
    # tag: (what reading needs, what changing needs)
    "agents": (READ, OPERATE),
    "audit": (READ, ADMINISTER),
    "auth": (READ, ADMINISTER),
    "canaries": (READ, OPERATE),
    "capacity": (READ, OPERATE),
    "client-jobs": (READ, OPERATE),
    "eval": (READ, OPERATE),
    "explain-placement": (READ, OPERATE),
    "fabric-test": (READ, OPERATE),
    "fabrics": (READ, OPERATE),
    "facility": (READ, OPERATE),
    "federation": (READ, OPERATE),
    "guard": (READ, OPERATE),
    "jobs": (READ, OPERATE),
    "kb": (READ, OPERATE),
    "keys": (Action.KEYS_READ, Action.KEYS),
    "metrics": (READ, READ),
    "models": (READ, OPERATE),
    "nodes": (READ, OPERATE),
    "notify": (READ, ADMINISTER),
    "nvlink": (READ, OPERATE),
    "openapi": (READ, READ),
    "orgs": (READ, ADMINISTER),
    "plan": (READ, OPERATE),
    "presets": (READ, OPERATE),
    "projects": (READ, ADMINISTER),
    "quotas": (READ, OPERATE),
    "replicas": (READ, OPERATE),
    "requests": (READ, ADMINISTER),
    "restart": (READ, OPERATE),
    "settings": (READ, ADMINISTER),
    "summary": (READ, OPERATE),
    "teams": (READ, ADMINISTER),
    "train": (READ, OPERATE),
    "updates": (READ, OPERATE),
    "usage": (READ, ADMINISTER),
    "users": (READ, Action.MEMBERS),
    "weights": (READ, OPERATE),
}
"""Each tag of the spec: what its reads need and what its changes need."""

OPERATIONS: dict[str, Action] = {
    "getRequestsIdBody": ADMINISTER,  # what a client sent and was answered: theirs, not the fleet's
    "putSettings": Action.SETTINGS,  # billing: prices and budgets alone
    "postKbSearch": OPERATE,  # reads documents' text
    # opod's own operations (tag opod)
    "getNodeTokens": READ,
    "getModelStates": READ,
    "getOpodNodeModels": READ,
    "postNodeTokens": ADMINISTER,
    "deleteNodeTokensId": ADMINISTER,
    "postModelsNameLoad": OPERATE,
    "postModelsNameUnload": OPERATE,
    "postAccounts": ADMINISTER,
    "putAccountsIdPassword": ADMINISTER,
    "putAccountsId": ADMINISTER,
}
"""Operations whose action is not their tag's: these win over :data:`BY_TAG`."""

_READS = frozenset({"GET", "HEAD"})


def action_for(operation_id: str, tag: str, method: str) -> Action | None:
    """The action an operation needs; None for one neither table knows (refused to every session)."""
    if operation_id in OPERATIONS:
        return OPERATIONS[operation_id]
    pair = BY_TAG.get(tag)
    if pair is None:
        return None
    return pair[0] if method in _READS else pair[1]


@dataclass(frozen=True, slots=True)
class Operation:
    """A routed call as the gate sees it."""

    operation_id: str
    tag: str
    method: str
    path_params: Mapping[str, str]
    query: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Refused:
    status: int
    message: str


_STATUS: dict[type[StoreError], int] = {InvalidInput: 400, Forbidden: 403, NotFound: 404, Conflict: 409}


class SessionGate:
    """Who a session is, and whether their call may go on."""

    def __init__(
        self,
        sessions: Sessions,
        permissions: Permissions,
        tenancy: Tenancy,
        access: AccessService,
        settings: SettingsService,
    ) -> None:
        self.sessions = sessions
        self._permissions = permissions
        self._tenancy = tenancy
        self._access = access
        self._settings = settings

    async def check(self, signed_in: SignedIn, call: Operation) -> Refused | None:
        """None when the person may make ``call``; else the refusal (403, or the status of what the check read)."""
        action = action_for(call.operation_id, call.tag, call.method)
        what = f"{call.method} {call.operation_id}"
        try:
            if action is None:
                raise Forbidden(f"{what} is for the admin key only")
            await self._check(signed_in.person, action, call, what)
        except StoreError as err:
            status = next((s for kind, s in _STATUS.items() if isinstance(err, kind)), 503)
            return Refused(status, str(err))
        return None

    async def _check(self, person: UserRecord, action: Action, call: Operation, what: str) -> None:
        permissions = self._permissions
        if action is Action.KEYS_READ:
            project = call.query.get("project", "")
            key_id = call.path_params.get("id", "")
            project_id = await self._key_project(key_id) if key_id else self._project(project)
            permissions.require_key_read(person, project_id, what)
        elif action is Action.KEYS:
            if call.method == "DELETE":
                project_id, owner = await self._key_owner(call.path_params.get("id", ""))
            else:
                body = _json(call.body)
                project_id = self._project(_text(body, "project"))
                owner = self._person(_text(body, "user"))
            permissions.require_key_change(person, project_id, owner, what)
        elif action is Action.MEMBERS:
            target = _text(_json(call.body), "target")
            scope_id = (
                self._tenancy.resolve(target, kinds=("org", "team", "project"), field="target").id if target else ""
            )
            permissions.require_members_change(person, scope_id, what)
        elif action is Action.SETTINGS:
            permissions.require_settings_change(person, await self._changed_sections(call.body), what)
        else:
            permissions.require(person, action, what)

    def _project(self, text: str) -> str:
        return self._tenancy.resolve(text, kinds=("project",), field="project").id if text else ""

    def _person(self, text: str) -> str:
        person = self._tenancy.user(text) if text else None
        return str(person.id) if person is not None else ""

    async def _key_owner(self, key_id: str) -> tuple[str, str]:
        try:
            record = await self._access.get_key(key_id)
        except NotFound:
            record = None
        if record is None or record.kind != "api":
            return "", ""  # nobody's key: only those who may revoke any key go on, to be told it does not exist
        return record.project_id, record.user_id

    async def _key_project(self, key_id: str) -> str:
        return (await self._key_owner(key_id))[0]

    async def _changed_sections(self, body: bytes) -> set[str]:
        """The settings sections a new body changes from the newest version; every section for a body not read."""
        text = _text(_json(body), "body")
        try:
            new = parse_settings(text)
            newest = await self._settings.version()
            old = parse_settings(newest.body if newest is not None else "")
        except SettingsInvalid:
            return {"a body that does not read as settings"}  # billing's alone it is not: an admin is told why
        return {name for name in type(new).model_fields if getattr(new, name) != getattr(old, name)}


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body) if body.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(body: Mapping[str, Any], field: str) -> str:
    value = body.get(field)
    return value if isinstance(value, str) else ""


__all__ = ["BY_TAG", "OPERATIONS", "Operation", "Refused", "SessionGate", "action_for"]
