"""Reports over the usage rows: totals per tenancy level, spend since a time, and the export by period.

The export is read one chunk of time at a time (a day of hours, a month of days or months), each
chunk one GROUP BY over the rows in [chunk start, chunk end) through the ``ts`` index. The chunks
meet at period boundaries, so every row lands in exactly one bucket of one chunk: a year of rows
is never held in memory, and nothing is counted twice. Buckets are cut in SQL as text
(``YYYY-MM-DD HH``, ``YYYY-MM-DD``, ``YYYY-MM``), the same text on both databases.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, case, func, literal, select

from opod.store.errors import InvalidInput

LEVELS = {"org": "org_id", "team": "team_id", "project": "project_id"}
"""Tenancy level → its usage column."""
SCOPE_COLUMNS = {**LEVELS, "user": "user_id", "key": "api_key_id"}
"""A scope kind → the usage column naming it."""
DIMENSIONS = {**SCOPE_COLUMNS, "model": "model"}
"""An export dimension → its usage column."""
PERIODS = ("hour", "day", "month")
NOT_ERRORS = ("ok", "cancelled")
LIMITED_MARK = '%"limited":%'
"""A refusal by a budget or quota carries ``{"limited": ...}`` in its route record."""


@dataclass(frozen=True, slots=True)
class ScopeTotals:
    """What one scope of a tenancy level spent since a time."""

    id: str
    keys: int
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_micros: int
    errors: int
    last_at: datetime | None


@dataclass(frozen=True, slots=True)
class ExportTotals:
    """One export row: a period's start and the dimensions asked for (the others ``None``)."""

    period: datetime
    dims: dict[str, str]
    requests: int
    errors: int
    limited: int
    prompt: int
    completion: int
    cost_micros: int


def _errors(table: Any) -> ColumnElement[Any]:
    return func.coalesce(func.sum(case((table.c.outcome.in_(NOT_ERRORS), 0), else_=1)), 0)


def scope_totals(conn: Connection, table: Any, level: str, since: datetime) -> list[ScopeTotals]:
    if level not in LEVELS:
        raise InvalidInput(f"by: {level!r} is not one of {', '.join(LEVELS)}")
    column = table.c[LEVELS[level]]
    query = (
        select(
            column.label("id"),
            func.count(func.distinct(table.c.api_key_id)),
            func.count(),
            func.coalesce(func.sum(table.c.prompt_tokens), 0),
            func.coalesce(func.sum(table.c.completion_tokens), 0),
            func.coalesce(func.sum(table.c.cost_micros), 0),
            _errors(table),
            func.max(table.c.ts),
        )
        .where(table.c.ts >= since, column != "")
        .group_by(column)
        .order_by(column)
    )
    out = []
    for row in conn.execute(query):
        last = row[7]
        if isinstance(last, str):  # SQLite's max() of the text it keeps
            last = datetime.fromisoformat(last)
        if last is not None and last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        out.append(
            ScopeTotals(row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]), int(row[6]), last)
        )
    return out


def spent_since(conn: Connection, table: Any, kind: str, ident: str, since: datetime) -> int:
    if kind not in SCOPE_COLUMNS:
        raise InvalidInput(f"scope kind {kind!r} is not one of {', '.join(SCOPE_COLUMNS)}")
    query = select(func.coalesce(func.sum(table.c.cost_micros), 0)).where(
        table.c[SCOPE_COLUMNS[kind]] == ident, table.c.ts >= since
    )
    return int(conn.execute(query).scalar_one())


def dimensions(text: str | None) -> list[str]:
    """``org,team,model`` → the export's dimensions, in the order given; InvalidInput naming a wrong one."""
    names = [part.strip().lower() for part in (text or "").split(",") if part.strip()]
    for name in names:
        if name not in DIMENSIONS:
            raise InvalidInput(f"by: {name!r} is not a dimension; use a comma list of {', '.join(DIMENSIONS)}")
    return list(dict.fromkeys(names))


def truncate(period: str, at: datetime) -> datetime:
    """The start of the period holding ``at`` (UTC)."""
    at = at.astimezone(UTC)
    if period == "hour":
        return at.replace(minute=0, second=0, microsecond=0)
    if period == "day":
        return at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    raise InvalidInput(f"period: {period!r} is not one of {', '.join(PERIODS)}")


def _next_month(at: datetime) -> datetime:
    return at.replace(year=at.year + 1, month=1) if at.month == 12 else at.replace(month=at.month + 1)


def chunks(period: str, start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """[start, end) cut at period boundaries into pieces of a day (hours), a month (days) or a year (months)."""
    at = start
    while at < end:
        base = truncate(period, at)
        if period == "hour":
            stop = truncate("day", base) + timedelta(days=1)
        elif period == "day":
            stop = _next_month(truncate("month", base))
        else:
            stop = base.replace(year=base.year + 1, month=1)
        stop = min(stop, end)
        yield at, stop
        at = stop


def _bucket(conn: Connection, table: Any, period: str) -> ColumnElement[Any]:
    width = {"hour": 13, "day": 10, "month": 7}[period]
    if conn.dialect.name == "postgresql":
        pattern = {"hour": "YYYY-MM-DD HH24", "day": "YYYY-MM-DD", "month": "YYYY-MM"}[period]
        return func.to_char(func.timezone("UTC", table.c.ts), pattern)
    return func.substr(table.c.ts, 1, width)  # SQLite keeps "YYYY-MM-DD HH:MM:SS.ffffff" in UTC


def _parse_bucket(text: str) -> datetime:
    if len(text) == 7:
        text += "-01"
    if len(text) == 10:
        text += " 00"
    return datetime.strptime(text, "%Y-%m-%d %H").replace(tzinfo=UTC)


def export_chunk(
    conn: Connection, table: Any, period: str, dims: Sequence[str], start: datetime, end: datetime
) -> list[ExportTotals]:
    """The export's rows for [start, end), by bucket and then the dimensions' values."""
    bucket = _bucket(conn, table, period).label("bucket")
    columns = [table.c[DIMENSIONS[d]] for d in dims]
    limited = func.coalesce(
        func.sum(
            case((and_(table.c.route_json.is_not(None), table.c.route_json.like(LIMITED_MARK)), 1), else_=literal(0))
        ),
        0,
    )
    query = (
        select(
            bucket,
            *columns,
            func.count(),
            _errors(table),
            limited,
            func.coalesce(func.sum(table.c.prompt_tokens), 0),
            func.coalesce(func.sum(table.c.completion_tokens), 0),
            func.coalesce(func.sum(table.c.cost_micros), 0),
        )
        .where(table.c.ts >= start, table.c.ts < end)
        .group_by(bucket, *columns)
        .order_by(bucket, *columns)
    )
    out = []
    n = len(dims)
    for row in conn.execute(query):
        values = row[1 : 1 + n]
        counts = [int(v) for v in row[1 + n :]]
        out.append(ExportTotals(_parse_bucket(row[0]), dict(zip(dims, values)), *counts))
    return out
