"""``/api/v1/keys`` (API keys) and ``/api/v1/node-tokens`` (tokens workers join with).

A key is a project's, a person's in a project they belong to, or a person's own. It is shown
once, in the answer that creates it; only its SHA-256 is kept. Its band is its admission class;
its lifetime is bounded by every scope above it (the cluster settings' ``keys``). Revoking takes
effect on the next request: the access service changes the gateway's key table right after the
store. The keys that exist besides (``opod token``'s, the auth file's) are in the same list; the
auth file's are read-only, with their ``k_cp_`` ids.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends

from opod.access.keytable import BANDS, DEFAULT_PROFILE, KeyEntry
from opod.access.scopes import Scope
from opod.access.service import MintedKind
from opod.access.tenancy import Tenancy
from opod.contract.admin.tenancy import KeyCreated, KeyCreateRequest, KeyView
from opod.control.audit import AuditDraft, audit_draft
from opod.control.context import ControlContext, ControlError, parse_lifetime
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.security.keys import new_key_id
from opod.settings.schema import duration_seconds
from opod.store import KeyRecord, NotFound
from opod.store.errors import StoreError


def _state(revoked: bool, expires_at: datetime | None) -> str:
    now = datetime.now(UTC)
    return "revoked" if revoked else "expired" if expires_at and expires_at <= now else "active"


def view(record: KeyRecord, tenancy: Tenancy | None = None) -> KeyView:
    person = tenancy.user(record.user_id) if tenancy is not None and record.user_id else None
    return KeyView(
        id=record.id,
        name=record.name,
        prefix=record.prefix,
        state=_state(record.revoked_at is not None, record.expires_at),
        created_at=record.created_at,
        expires_at=record.expires_at,
        revoked_at=record.revoked_at,
        last_used_at=record.last_used_at,
        project=record.project_id or None,
        project_path=(tenancy.path(record.project_id) or None) if tenancy is not None and record.project_id else None,
        user=record.user_id or None,
        user_email=getattr(person, "email", None) or None,
        band=record.admission_class or None,
        routing_profile=record.routing_profile or None,
    )


def file_view(entry: KeyEntry, tombstoned: bool, issued_at: datetime | None) -> KeyView:
    """A key from the manager's auth file: read-only here, known by its ``k_cp_`` id; the file holds no prefix of it,
    and its creation is the file's ``issuedAt`` (else when this leader applied the file)."""
    return KeyView(
        id=entry.id,
        name=entry.name,
        prefix="",
        state=_state(entry.revoked or tombstoned, entry.expires_at),
        created_at=issued_at,
        expires_at=entry.expires_at,
        band=entry.admission_class or None,
    )


def _target(kind: MintedKind) -> str:
    """How the audit names a key's kind in its targets (``key:ID``, ``node-token:ID``)."""
    return "node-token" if kind == "node" else "key"


def _what(kind: MintedKind) -> str:
    return "node token" if kind == "node" else "API key"


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    def lifetime_limits(project_id: str, user_id: str) -> list[tuple[str, timedelta]]:
        """(scope, longest lifetime) of every scope above the key that limits it, from the cluster settings."""
        rules = ctx.settings.current.keys
        limits: list[tuple[str, timedelta]] = []
        if rules.max_lifetime:
            limits.append(
                ("the cluster (settings keys.max_lifetime)", timedelta(seconds=duration_seconds(rules.max_lifetime)))
            )
        if not rules.scopes:
            return limits
        above = {s.text for s in ctx.tenancy.ancestors(Scope("project", project_id))} if project_id else set()
        if user_id:
            above.add(Scope("user", user_id).text)
        for text, limit in rules.scopes.items():
            if not limit:
                continue
            try:
                scope = ctx.tenancy.resolve(text)
            except StoreError:
                continue  # a scope the settings name that no longer exists limits nothing
            if scope.text in above:
                limits.append(
                    (
                        f"{scope.kind} {ctx.tenancy.scope_path(scope)} (settings keys.scopes)",
                        timedelta(seconds=duration_seconds(limit)),
                    )
                )
        return limits

    def expiry(expires_in: str | None, project_id: str, user_id: str) -> datetime | None:
        lifetime = parse_lifetime(expires_in)
        limits = lifetime_limits(project_id, user_id)
        if lifetime is not None:
            for scope, limit in limits:
                if lifetime > limit:
                    raise ControlError(
                        400,
                        f"expires_in: {expires_in} is longer than {scope} allows: keys there live at most "
                        f"{_duration(limit)}; ask for {_duration(limit)} or less",
                    )
        elif limits:
            lifetime = min(limit for _, limit in limits)  # "none" still ends where a scope above says keys end
        return datetime.now(UTC) + lifetime if lifetime else None

    def owner(body: KeyCreateRequest) -> tuple[str, str]:
        """The project and person a key is for, checked: (project ID, user ID), each ``""`` when not given."""
        project_id = user_id = ""
        if body.project:
            project_id = ctx.tenancy.resolve(body.project, kinds=("project",), field="project").id
        if body.user:
            person = ctx.tenancy.user(body.user)
            if person is None:
                raise ControlError(404, f"user: no person {body.user!r} (by ID or email); GET /api/v1/users lists them")
            user_id = str(person.id)
            if not ctx.tenancy.user_active(user_id):
                raise ControlError(409, f"user: {body.user} is deactivated; reinstate them before issuing them a key")
            if project_id and ctx.tenancy.belongs(user_id, project_id) is False:
                raise ControlError(
                    403,
                    f"user: {body.user} is not a member of project {ctx.tenancy.path(project_id)}; "
                    "add a membership first (POST /api/v1/users/{id}/memberships), or leave project out",
                )
        return project_id, user_id

    def traits(body: KeyCreateRequest) -> tuple[str, str]:
        band, profile = body.band or "", body.routing_profile or ""
        if band and band not in BANDS:
            raise ControlError(400, f"band: {band!r} is not an admission class; use one of {', '.join(BANDS)}")
        known = [DEFAULT_PROFILE, *ctx.settings.current.routing_profiles]
        if profile and profile not in known:
            raise ControlError(
                400,
                f"routing_profile: {profile!r} is not a routing profile here; the known ones are {', '.join(known)} "
                "(define more under routing_profiles in the settings)",
            )
        return band, profile

    async def create(kind: MintedKind, body: KeyCreateRequest, draft: AuditDraft) -> KeyCreated:
        if kind == "node" and any((body.project, body.user, body.band, body.routing_profile)):
            raise ControlError(
                400,
                "project, user, band, routing_profile: a node token belongs to a machine, not a project "
                "or person; leave them out",
            )
        project_id, user_id = owner(body)
        band, profile = traits(body)
        expires = expiry(body.expires_in, project_id, user_id)
        key_id = new_key_id(kind)
        name = body.name or ("node token" if kind == "node" else "api key")
        detail = {
            "name": name,
            "project": project_id,
            "user": user_id,
            "band": band,
            "routing_profile": profile,
            "expires_at": expires.isoformat() if expires else "",
        }
        with draft.commit(target=f"{_target(kind)}:{key_id}", detail=detail) as audit:
            record, secret = await ctx.access.create(
                kind,
                name,
                expires,
                project_id=project_id,
                user_id=user_id,
                band=band,
                routing_profile=profile,
                key_id=key_id,
                audit=audit,
            )
        if project_id:
            ctx.tenancy.mark_had_key(project_id)
        return KeyCreated(**view(record, ctx.tenancy).model_dump(exclude_none=True), secret=secret)

    def file_keys() -> list[KeyView]:
        tombstones = ctx.access.keys.tombstones
        auth = ctx.access.keys.auth
        entries = list(auth.by_hash.values()) if auth is not None else []
        return [
            file_view(e, e.id in tombstones, (auth.issued_at or auth.applied_at) if auth is not None else None)
            for e in entries
        ]

    async def one(kind: MintedKind, key_id: str) -> KeyRecord:
        try:
            record = await ctx.access.get_key(key_id)
        except NotFound:
            record = None
        if record is None or record.kind != kind:
            raise ControlError(
                404, f"no {_what(kind)} {key_id!r}; `opod token ls{' --node' if kind == 'node' else ''}` lists them"
            )
        return record

    async def revoke(kind: MintedKind, key_id: str, draft: AuditDraft) -> dict[str, Any]:
        if kind == "api" and any(v.id == key_id for v in file_keys()):
            raise ControlError(
                409,
                f"key {key_id} comes from the manager's auth file, which this API does not change; "
                "the manager revokes it (the auth file's revokedKeys)",
            )
        await one(kind, key_id)
        with draft.commit(target=f"{_target(kind)}:{key_id}") as audit:
            record = await ctx.access.revoke(key_id, audit=audit)
        return {"id": record.id, "revoked": True}

    @api.get("/api/v1/keys", operation_id="getKeys", tags=["keys"], response_model=list[KeyView])
    async def get_keys(project: str | None = None) -> list[KeyView]:
        if project:
            project_id = ctx.tenancy.resolve(project, kinds=("project",), field="project").id
            return [view(r, ctx.tenancy) for r in await ctx.access.list_keys("api", project_id=project_id)]
        return [view(r, ctx.tenancy) for r in await ctx.access.list_keys("api")] + file_keys()

    @api.post("/api/v1/keys", operation_id="postKeys", tags=["keys"], response_model=KeyCreated, status_code=201)
    async def post_keys(body: KeyCreateRequest, draft: AuditDraft = Depends(audit_draft)) -> KeyCreated:
        return await create("api", body, draft)

    @api.get("/api/v1/keys/{id}", operation_id="getKeysId", tags=["keys"], response_model=KeyView)
    async def get_keys_id(id: str) -> KeyView:
        for listed in file_keys():
            if listed.id == id:
                return listed
        return view(await one("api", id), ctx.tenancy)

    @api.delete("/api/v1/keys/{id}", operation_id="deleteKeysId", tags=["keys"], response_model=dict[str, Any])
    async def delete_keys_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> dict[str, Any]:
        return await revoke("api", id, draft)

    # Node tokens (the keys workers join with) are opod's own: the spec has no route for them.
    @api.get("/api/v1/node-tokens", operation_id="getNodeTokens", tags=[EXTENSION_TAG], response_model=list[KeyView])
    async def get_node_tokens() -> list[KeyView]:
        return [view(r) for r in await ctx.access.list_keys("node")]

    @api.post(
        "/api/v1/node-tokens",
        operation_id="postNodeTokens",
        tags=[EXTENSION_TAG],
        response_model=KeyCreated,
        status_code=201,
    )
    async def post_node_tokens(body: KeyCreateRequest, draft: AuditDraft = Depends(audit_draft)) -> KeyCreated:
        return await create("node", body, draft)

    @api.delete(
        "/api/v1/node-tokens/{id}",
        operation_id="deleteNodeTokensId",
        tags=[EXTENSION_TAG],
        response_model=dict[str, Any],
    )
    async def delete_node_tokens_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> dict[str, Any]:
        return await revoke("node", id, draft)

    return api


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h" if not rest else f"{seconds}s"
