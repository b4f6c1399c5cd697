"""``/api/v1/keys`` (API keys) and ``/api/v1/node-tokens`` (tokens workers join with).

A key is shown once, in the answer that creates it; only its SHA-256 is kept.
Revoking takes effect on the next request, because the gateway's key table
changes in the same moment as the store.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel

from opod.access.keytable import KeyEntry
from opod.access.nodetokens import NodeToken
from opod.control.context import ControlContext, ControlError, parse_lifetime
from opod.security.keys import API_PREFIX, display_prefix, hash_key, new_secret


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


def view(record, cls=KeyView, **extra) -> KeyView:
    now = datetime.now(UTC)
    state = "revoked" if record.revoked_at else "expired" if record.expires_at and record.expires_at <= now else "active"
    return cls(
        id=record.id, name=record.name, prefix=record.prefix, state=state, created_at=record.created_at,
        expires_at=record.expires_at, revoked_at=record.revoked_at, last_used_at=record.last_used_at,
        node_id=record.node_id, **extra,
    )


def router(ctx: ControlContext) -> APIRouter:
    api = APIRouter()

    async def create(kind: str, body: KeyCreateRequest) -> KeyCreated:
        lifetime = parse_lifetime(body.expires_in)
        now = datetime.now(UTC)
        expires = now + lifetime if lifetime else None
        if kind == "node":
            token_id = "t_" + secrets.token_hex(5)
            secret = ctx.tokens.minter.token(token_id)
        else:
            token_id, secret = None, new_secret(API_PREFIX)
        name = body.name or ("node token" if kind == "node" else "api key")
        record = await ctx.db(
            "create_key", kind=kind, name=name, hash=hash_key(secret), prefix=display_prefix(secret),
            expires_at=expires, id=token_id, created_at=now,
        )
        if kind == "node":
            ctx.tokens.put(NodeToken(record.id, record.name, record.expires_at))
        else:
            ctx.keys.put(KeyEntry(record.id, kind, record.name, record.hash, record.expires_at))
        return view(record, KeyCreated, secret=secret)

    async def listing(kind: str) -> list[KeyView]:
        return [view(r) for r in await ctx.db("list_keys", kind)]

    async def one(kind: str, key_id: str) -> KeyView:
        record = await ctx.db("get_key", key_id)
        if record.kind != kind:
            raise ControlError(404, f"no {'node token' if kind == 'node' else 'API key'} {key_id!r}")
        return view(record)

    async def revoke(kind: str, key_id: str) -> dict:
        await one(kind, key_id)
        record = await ctx.db("revoke_key", key_id, datetime.now(UTC))
        if kind == "node":
            ctx.tokens.revoke(record.id)
        else:
            ctx.keys.revoke(record.id)
        return {"revoked": record.id}

    @api.get("/api/v1/keys", response_model=list[KeyView], response_model_exclude_none=True)
    async def get_keys() -> list[KeyView]:
        return await listing("api")

    @api.post("/api/v1/keys", status_code=201, response_model=KeyCreated, response_model_exclude_none=True)
    async def post_keys(body: KeyCreateRequest) -> KeyCreated:
        return await create("api", body)

    @api.get("/api/v1/keys/{key_id}", response_model=KeyView, response_model_exclude_none=True)
    async def get_key(key_id: str) -> KeyView:
        return await one("api", key_id)

    @api.delete("/api/v1/keys/{key_id}")
    async def delete_key(key_id: str, request: Request) -> dict:
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
