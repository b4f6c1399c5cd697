"""One request's record: its usage row found by request id, and the bodies kept of it (``request_bodies``).

Bodies are written in batches by :class:`opod.ledger.bodies.BodyKeeper`, off the request path, and
deleted once past ``expires_at`` by the ledger's retention. A client may send the same
``X-Request-Id`` twice: the record is its newest usage row, and the body kept is the newest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, select

from opod.store.base import aware, text_arg
from opod.store.errors import InvalidInput, NotFound
from opod.store.events import DELETE_BATCH, count_arg
from opod.store.schema import request_bodies
from opod.store.usage import UsageRecord, UsageRepo, usage


@dataclass(frozen=True, slots=True)
class RequestBody:
    """A request's body and its answer's as kept (each side cut to the retention's cap, ``truncated`` then)."""

    request_id: str
    project_id: str
    at: datetime
    expires_at: datetime
    path: str
    model: str
    served_model: str
    status: int
    request: str
    response: str
    truncated: bool


def _body_values(row: RequestBody) -> dict[str, Any]:
    if not isinstance(row, RequestBody):
        raise InvalidInput(f"a request body to keep must be a RequestBody, not {type(row).__name__}")
    for name, value in (("request", row.request), ("response", row.response)):
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidInput(f"the {name} body of request {row.request_id!r} must be text without NUL characters")
    return {
        "request_id": text_arg(row.request_id, "request_id"),
        "project_id": text_arg(row.project_id, "project_id", empty=True),
        "at": aware(row.at, "at"),
        "expires_at": aware(row.expires_at, "expires_at"),
        "path": text_arg(row.path, "path", empty=True),
        "model": text_arg(row.model, "model", empty=True),
        "served_model": text_arg(row.served_model, "served_model", empty=True),
        "status": count_arg(row.status, "status"),
        "request": row.request,
        "response": row.response,
        "truncated": row.truncated is True,
    }


class RequestsRepo(UsageRepo):
    def find_request(self, request_id: str) -> UsageRecord:
        """The newest usage row answered with ``request_id``; NotFound naming it."""
        request_id = text_arg(request_id, "request id")
        query = select(usage).where(usage.c.request_id == request_id).order_by(usage.c.id.desc()).limit(1)
        with self._read() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise NotFound(
                f"no request {request_id!r} is recorded; use the X-Request-Id a /v1 answer carried "
                "(records older than the usage retention are deleted)"
            )
        return UsageRecord(**row._mapping)

    def keep_request_bodies(self, rows: Sequence[RequestBody]) -> int:
        """Store the bodies in one transaction (a request id kept before is replaced); how many were written."""
        # The last body offered for a request id wins; one statement may meet each row once.
        values = list({value["request_id"]: value for value in map(_body_values, rows)}.values())
        self._ledger_appender().keep_bodies(values)
        return len(values)

    def get_request_body(self, request_id: str) -> RequestBody:
        """The body kept of ``request_id`` (expired or not: the caller says which); NotFound when none is."""
        request_id = text_arg(request_id, "request id")
        with self._read() as conn:
            row = conn.execute(select(request_bodies).where(request_bodies.c.request_id == request_id)).first()
        if row is None:
            raise NotFound(f"no body is kept for request {request_id!r}")
        return _body(row)

    def delete_request_bodies_expired(self, now: datetime, *, limit: int = DELETE_BATCH) -> int:
        """Delete up to ``limit`` bodies whose ``expires_at`` has passed; how many went."""
        now = aware(now, "now")
        limit = count_arg(limit, "limit")
        due = select(request_bodies.c.request_id).where(request_bodies.c.expires_at <= now).limit(limit)
        with self._write() as conn:
            return conn.execute(
                delete(request_bodies).where(request_bodies.c.request_id.in_(due.scalar_subquery()))
            ).rowcount


def _body(row: Row[Any]) -> RequestBody:
    return RequestBody(**row._mapping)
