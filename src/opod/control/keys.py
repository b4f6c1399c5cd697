"""``/api/v1/keys`` (API keys) and ``/api/v1/node-tokens`` (tokens workers join with).

The rules (whose a key is, its band, routing profile and lifetime) are
:class:`opod.access.keys.KeyService`'s. A key is shown once, in the answer that creates it; only
its SHA-256 is kept. Revoking takes effect on the next request. The keys that exist besides
(``opod token``'s, the auth file's) are in the same list; the auth file's are read-only, with
their ``k_cp_`` ids.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends

from opod.access.keys import FileKey, KeyOrder, KeyService
from opod.access.service import MintedKind
from opod.access.tenancy import Tenancy
from opod.contract.admin.tenancy import KeyCreated, KeyCreateRequest, KeyView
from opod.control.audit import AuditDraft, audit_draft
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.store import KeyRecord


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


def file_view(key: FileKey) -> KeyView:
    """A key from the manager's auth file: the file holds no prefix of it."""
    entry = key.entry
    return KeyView(
        id=entry.id,
        name=entry.name,
        prefix="",
        state=_state(key.revoked, entry.expires_at),
        created_at=key.issued_at,
        expires_at=entry.expires_at,
        band=entry.admission_class or None,
    )


def _order(body: KeyCreateRequest) -> KeyOrder:
    return KeyOrder(
        name=body.name,
        project=body.project,
        user=body.user,
        band=body.band,
        routing_profile=body.routing_profile,
        expires_in=body.expires_in,
    )


def router(keys: KeyService, tenancy: Tenancy) -> APIRouter:
    api = SpecRouter()

    def shown(key: KeyRecord | FileKey, kind: MintedKind = "api") -> KeyView:
        if isinstance(key, FileKey):
            return file_view(key)
        return view(key, tenancy if kind == "api" else None)

    async def create(kind: MintedKind, body: KeyCreateRequest, draft: AuditDraft) -> KeyCreated:
        record, secret = await keys.create(kind, _order(body), audit=draft)
        return KeyCreated(**view(record, tenancy).model_dump(exclude_none=True), secret=secret)

    async def revoke(kind: MintedKind, key_id: str, draft: AuditDraft) -> dict[str, Any]:
        record = await keys.revoke(kind, key_id, audit=draft)
        return {"id": record.id, "revoked": True}

    @api.get("/api/v1/keys", operation_id="getKeys", tags=["keys"], response_model=list[KeyView])
    async def get_keys(project: str | None = None) -> list[KeyView]:
        return [shown(k) for k in await keys.listing("api", project)]

    @api.post("/api/v1/keys", operation_id="postKeys", tags=["keys"], response_model=KeyCreated, status_code=201)
    async def post_keys(body: KeyCreateRequest, draft: AuditDraft = Depends(audit_draft)) -> KeyCreated:
        return await create("api", body, draft)

    @api.get("/api/v1/keys/{id}", operation_id="getKeysId", tags=["keys"], response_model=KeyView)
    async def get_keys_id(id: str) -> KeyView:
        return shown(await keys.find("api", id))

    @api.delete("/api/v1/keys/{id}", operation_id="deleteKeysId", tags=["keys"], response_model=dict[str, Any])
    async def delete_keys_id(id: str, draft: AuditDraft = Depends(audit_draft)) -> dict[str, Any]:
        return await revoke("api", id, draft)

    # Node tokens (the keys workers join with) are opod's own: the spec has no route for them.
    @api.get("/api/v1/node-tokens", operation_id="getNodeTokens", tags=[EXTENSION_TAG], response_model=list[KeyView])
    async def get_node_tokens() -> list[KeyView]:
        return [shown(k, "node") for k in await keys.listing("node")]

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
