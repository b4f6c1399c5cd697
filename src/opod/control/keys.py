"""``/api/v1/keys`` (API keys) and ``/api/v1/node-tokens`` (tokens workers join with).

A key is shown once, in the answer that creates it; only its SHA-256 is kept.
Revoking takes effect on the next request: the access service changes the
gateway's key table right after the store.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter
from pydantic import BaseModel

from opod.access.service import MintedKind
from opod.control.context import ControlContext, ControlError, parse_lifetime
from opod.store import KeyRecord, NotFound


class KeyCreateRequest(BaseModel):
    name: str = ""
    project: str = ""
    user: str = ""
    band: str = ""
    routing_profile: str = ""
    expires_in: str = ""


class KeyView(BaseModel):
    id: str
    name: str
    prefix: str
    state: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    node_id: str | None = None


class KeyCreated(KeyView):
    secret: str


def _state(record: KeyRecord) -> str:
    now = datetime.now(UTC)
    return "revoked" if record.revoked_at else "expired" if record.expires_at and record.expires_at <= now else "active"


def view(record: KeyRecord) -> KeyView:
    return KeyView(
        id=record.id, name=record.name, prefix=record.prefix, state=_state(record), created_at=record.created_at,
        expires_at=record.expires_at, revoked_at=record.revoked_at, last_used_at=record.last_used_at, node_id=record.node_id,
    )


def _what(kind: MintedKind) -> str:
    return "node token" if kind == "node" else "API key"


def router(ctx: ControlContext) -> APIRouter:
    api = APIRouter()

    async def create(kind: MintedKind, body: KeyCreateRequest) -> KeyCreated:
        lifetime = parse_lifetime(body.expires_in)
        expires = datetime.now(UTC) + lifetime if lifetime else None
        record, secret = await ctx.access.create(kind, body.name or ("node token" if kind == "node" else "api key"), expires)
        return KeyCreated(**view(record).model_dump(), secret=secret)

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

    async def revoke(kind: MintedKind, key_id: str) -> dict:
        await one(kind, key_id)
        record = await ctx.access.revoke(key_id)
        return {"revoked": record.id}

    @api.get("/api/v1/keys", response_model=list[KeyView], response_model_exclude_none=True)
    async def get_keys() -> list[KeyView]:
        return await listing("api")

    @api.post("/api/v1/keys", status_code=201, response_model=KeyCreated, response_model_exclude_none=True)
    async def post_keys(body: KeyCreateRequest) -> KeyCreated:
        return await create("api", body)

    @api.get("/api/v1/keys/{key_id}", response_model=KeyView, response_model_exclude_none=True)
    async def get_key(key_id: str) -> KeyView:
        return view(await one("api", key_id))

    @api.delete("/api/v1/keys/{key_id}")
    async def delete_key(key_id: str) -> dict:
        return await revoke("api", key_id)

    @api.get("/api/v1/node-tokens", response_model=list[KeyView], response_model_exclude_none=True)
    async def get_node_tokens() -> list[KeyView]:
        return await listing("node")

    @api.post("/api/v1/node-tokens", status_code=201, response_model=KeyCreated, response_model_exclude_none=True)
    async def post_node_tokens(body: KeyCreateRequest) -> KeyCreated:
        return await create("node", body)

    @api.delete("/api/v1/node-tokens/{key_id}")
    async def delete_node_token(key_id: str) -> dict:
        return await revoke("node", key_id)

    return api
