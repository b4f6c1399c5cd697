"""One request's record: its usage row found by request id, and the bodies kept of it (``request_bodies``).

Bodies are written in batches by :class:`opod.ledger.bodies.BodyKeeper`, off the request path, and
deleted once past ``expires_at`` by the ledger's retention. A client may send the same
``X-Request-Id`` twice: the record is its newest usage row, and the body kept is the newest one.

:func:`checked_body` is the one rule for a kept body's values, for both ways in: a :class:`RequestBody`
(:meth:`RequestsRepo.keep_request_bodies`) and a :data:`BodyRow`, the plain tuple the gateway hands
over (:meth:`RequestsRepo.keep_body_rows`) because it is far cheaper to make on the event loop. Either
way each value is checked once, in the writer's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Final, cast

from sqlalchemy import Row, delete, select

from opod.store.base import MAX_TEXT, aware, text_arg
from opod.store.errors import InvalidInput, NotFound
from opod.store.events import DELETE_BATCH, INT64_MAX, count_arg
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


BodyRow = tuple[str, str, datetime, datetime, str, str, str, int, str, str, bool]
"""A kept body as its row's values, in :data:`BODY_COLUMNS` order."""

BODY_COLUMNS = tuple(c.name for c in request_bodies.columns)
"""The table's columns, in its order: :class:`RequestBody`'s fields, and a :data:`BodyRow`'s values."""
REQUEST_TEXT: Final = 8
RESPONSE_TEXT: Final = 9
"""Where a :data:`BodyRow` holds its two bodies."""

_ROW_VALUES = attrgetter(*BODY_COLUMNS)


def checked_body(row: object) -> BodyRow:
    """``row`` (a body's values in :data:`BODY_COLUMNS` order) as the table keeps them, each value checked by its
    field's rule; InvalidInput naming the first field it does not allow (the two bodies first)."""
    if type(row) is tuple and len(row) == len(BODY_COLUMNS):
        request_id, project_id, at, expires_at, path, model, served_model, status, request, response, truncated = row
        # The usual body passes every rule at once, in a few cheap tests; any other is checked field by field.
        if (
            type(request_id) is str
            and type(project_id) is str
            and type(path) is str
            and type(model) is str
            and type(served_model) is str
            and type(request) is str
            and type(response) is str
            and type(at) is datetime
            and type(expires_at) is datetime
            and at.tzinfo is UTC
            and expires_at.tzinfo is UTC
            and type(status) is int
            and type(truncated) is bool
            and "\x00" not in (joined := request_id + project_id + path + model + served_model)
            and "\x00" not in request
            and "\x00" not in response
            and (
                len(joined) <= MAX_TEXT
                or max(len(request_id), len(project_id), len(path), len(model), len(served_model)) <= MAX_TEXT
            )
            and request_id.strip()
            and 0 <= status <= INT64_MAX
        ):
            return cast(BodyRow, row)
    return _checked_fields(row)


def _checked_fields(row: object) -> BodyRow:
    if not isinstance(row, tuple) or len(row) != len(BODY_COLUMNS):
        raise InvalidInput(
            f"a request body row to keep must be a tuple of its {len(BODY_COLUMNS)} values "
            f"({', '.join(BODY_COLUMNS)}), not {type(row).__name__}"
        )
    request_id, project_id, at, expires_at, path, model, served_model, status, request, response, truncated = row
    for name, value in (("request", request), ("response", response)):
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidInput(f"the {name} body of request {request_id!r} must be text without NUL characters")
    return (
        text_arg(request_id, "request_id"),
        text_arg(project_id, "project_id", empty=True),
        aware(at, "at"),
        aware(expires_at, "expires_at"),
        text_arg(path, "path", empty=True),
        text_arg(model, "model", empty=True),
        text_arg(served_model, "served_model", empty=True),
        count_arg(status, "status"),
        request,
        response,
        truncated is True,
    )


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
        for row in rows:
            if not isinstance(row, RequestBody):
                raise InvalidInput(f"a request body to keep must be a RequestBody, not {type(row).__name__}")
        return self.keep_body_rows([_ROW_VALUES(row) for row in rows])

    def keep_body_rows(self, rows: Sequence[BodyRow]) -> int:
        """:meth:`keep_request_bodies` for bodies given as their rows' values (the gateway's), checked here all
        the same."""
        # The last body offered for a request id wins; one statement may meet each row once.
        values = list({row[0]: row for row in map(checked_body, rows)}.values())
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
