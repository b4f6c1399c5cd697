"""``/api/v1/keys`` (API keys) and ``/api/v1/node-tokens`` (tokens workers join with).

A key is shown once, in the answer that creates it; only its SHA-256 is kept.
Revoking takes effect on the next request: the access service changes the
gateway's key table right after the store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from opod.access.service import MintedKind
from opod.contract.admin.tenancy import KeyCreated, KeyCreateRequest, KeyView
from opod.control.context import ControlContext, ControlError, parse_lifetime
from opod.control.spec import EXTENSION_TAG, SpecRouter
from opod.store import KeyRecord, NotFound

TENANCY_FIELDS = ("project", "user", "band", "routing_profile")
"""Fields of a key that need tenancy and the key table's new columns; refused rather than dropped until then."""


def _state(record: KeyRecord) -> str:
    now = datetime.now(UTC)
    return "revoked" if record.revoked_at else "expired" if record.expires_at and record.expires_at <= now else "active"


def view(record: KeyRecord) -> KeyView:
    return KeyView(
        id=record.id, name=record.name, prefix=record.prefix, state=_state(record), created_at=record.created_at,
        expires_at=record.expires_at, revoked_at=record.revoked_at, last_used_at=record.last_used_at,
    )


def _what(kind: MintedKind) -> str:
    return "node token" if kind == "node" else "API key"


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    async def create(kind: MintedKind, body: KeyCreateRequest) -> KeyCreated:
        for field in TENANCY_FIELDS:
            if getattr(body, field):
                raise ControlError(501, f"{field}: keys for projects, people, bands and routing profiles need the management API's tenancy, which this opod does not have yet; leave {field} out")
        lifetime = parse_lifetime(body.expires_in)
        expires = datetime.now(UTC) + lifetime if lifetime else None
        record, secret = await ctx.access.create(kind, body.name or ("node token" if kind == "node" else "api key"), expires)
        return KeyCreated(**view(record).model_dump(exclude_none=True), secret=secret)

    async def listing(kind: MintedKind) -> list[KeyView]:
        return [view(r) for r in await ctx.access.list_keys(kind)]

    async def one(kind: MintedKind, key_id: str) -> KeyRecord:
        try:
            record = await ctx.access.get_key(key_id)
        except NotFound:
            record = None
        if record is None or record.kind != kind:
            raise ControlError(404, f"no {_what(kind)} {key_id!r}; `opod token ls{' --node' if kind == 'node' else ''}` lists them")
        return record

    async def revoke(kind: MintedKind, key_id: str) -> dict[str, Any]:
        await one(kind, key_id)
        record = await ctx.access.revoke(key_id)
        return {"id": record.id, "revoked": True}

    @api.get("/api/v1/keys", operation_id="getKeys", tags=["keys"], response_model=list[KeyView])
    async def get_keys(project: str | None = None) -> list[KeyView]:
        if project:
            raise ControlError(501, "project: listing a project's keys needs the management API's tenancy, which this opod does not have yet")
        return await listing("api")

    @api.post("/api/v1/keys", operation_id="postKeys", tags=["keys"], response_model=KeyCreated, status_code=201)
    async def post_keys(body: KeyCreateRequest) -> KeyCreated:
        return await create("api", body)

    @api.get("/api/v1/keys/{id}", operation_id="getKeysId", tags=["keys"], response_model=KeyView)
    async def get_keys_id(id: str) -> KeyView:
        return view(await one("api", id))

    @api.delete("/api/v1/keys/{id}", operation_id="deleteKeysId", tags=["keys"], response_model=dict[str, Any])
    async def delete_keys_id(id: str) -> dict[str, Any]:
        return await revoke("api", id)

    # Node tokens (the keys workers join with) are opod's own: the spec has no route for them.
    @api.get("/api/v1/node-tokens", operation_id="getNodeTokens", tags=[EXTENSION_TAG], response_model=list[KeyView])
    async def get_node_tokens() -> list[KeyView]:
        return await listing("node")

    @api.post("/api/v1/node-tokens", operation_id="postNodeTokens", tags=[EXTENSION_TAG], response_model=KeyCreated, status_code=201)
    async def post_node_tokens(body: KeyCreateRequest) -> KeyCreated:
        return await create("node", body)

    @api.delete("/api/v1/node-tokens/{id}", operation_id="deleteNodeTokensId", tags=[EXTENSION_TAG], response_model=dict[str, Any])
    async def delete_node_tokens_id(id: str) -> dict[str, Any]:
        return await revoke("node", id)

    return api
