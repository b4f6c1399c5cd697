"""Usage rows, one per ``/v1`` request: the rows behind ``/admin/v1/usage/stream``.

Counts and timings only, never content. Ids come from the store (BIGSERIAL / SQLite
AUTOINCREMENT) and are never handed out twice, even after retention deletes rows, so a cursor
stays valid across leader restarts. ``route_json`` is opod's own column (which worker, why) and
is not part of the contract's ``UsageData``. The table is registered on ``schema.metadata``.

:func:`checked_usage` is the one rule for a usage row's values, for every way in: the rows a caller
hands :meth:`UsageRepo.append_ledger`, refused when bad, and the ledger's records, cleaned where bad
(``opod.ledger.records``) and then stored as checked, so the writer checks each value once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter, itemgetter
from typing import Any, NewType

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Row,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    select,
    text,
)

from opod.store.base import MAX_TEXT, aware, json_arg, text_arg
from opod.store.bulk import LedgerAppender
from opod.store.commits import CommitsRepo
from opod.store.errors import InvalidInput
from opod.store.events import (
    CURSOR_ID,
    DELETE_BATCH,
    INT64_MAX,
    NewEvent,
    count_arg,
    delete_before,
    event_values,
    page_args,
)
from opod.store.events import events as events_table
from opod.store.schema import UTCDateTime, metadata, request_bodies
from opod.store.usage_report import ExportTotals, ScopeTotals, export_chunk, scope_totals, spent_since

usage = Table(
    "usage",
    metadata,
    Column("id", CURSOR_ID, primary_key=True, autoincrement=True),
    Column("entry", Text, nullable=False),  # the ledger's own key: replaying its journal inserts nothing twice
    Column("request_id", Text, nullable=False),  # the X-Request-Id answered; a client may reuse one, so not unique
    Column("ts", UTCDateTime, nullable=False),
    Column("api_key_id", Text, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("protocol", Text, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("latency_ms", BigInteger, nullable=False),
    Column("ttft_ms", BigInteger, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("node_id", Text, nullable=False),
    Column("route_json", Text, nullable=True),
    # Attribution (0009): the key's project and the project's team and org when the request was made,
    # so a later move in the tenancy tree does not rewrite what was spent where; '' = none.
    Column("project_id", Text, nullable=False, server_default=text("''")),
    Column("team_id", Text, nullable=False, server_default=text("''")),
    Column("org_id", Text, nullable=False, server_default=text("''")),
    Column("cost_micros", BigInteger, nullable=False, server_default=text("0")),
    # The request's record (0012): what ``GET /api/v1/requests/{id}`` shows beyond the counts.
    Column(
        "status", BigInteger, nullable=False, server_default=text("0")
    ),  # the HTTP status the client got; 0 = not known
    Column("served_model", Text, nullable=False, server_default=text("''")),  # the model that answered (a fallback)
    Column("queue_ms", BigInteger, nullable=False, server_default=text("0")),  # the wait for an admission slot
    Column("end_user", Text, nullable=False, server_default=text("''")),  # OpenAI's `user` field
    Column("tags_json", Text, nullable=True),  # OpenAI's `metadata` object of strings; NULL = none
    Column("cache_hit", Boolean, nullable=False, server_default=false()),
    Column(
        "body_state", Text, nullable=False, server_default=text("''")
    ),  # kept, off, no_store, dropped; '' = not said
    # What the guardrails did (0013, ``opod.gateway.guardrails``); '' and 0 = no guardrail was consulted.
    Column(
        "guard_action", Text, nullable=False, server_default=text("''")
    ),  # block, unavailable, rewrite, failed_open, flag, allow
    Column("guard_policy", Text, nullable=False, server_default=text("''")),  # the deciding guardrail's id
    Column("guard_rule", Text, nullable=False, server_default=text("''")),  # a webhook's phase, a policy's check
    Column("guard_category", Text, nullable=False, server_default=text("''")),  # the reason it gave, capped
    Column("guard_ms", BigInteger, nullable=False, server_default=text("0")),  # time spent in guardrail webhooks
    UniqueConstraint("entry"),
    Index("ix_usage_ts", "ts"),
    Index("ix_usage_request_id", "request_id"),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True, slots=True)
class NewUsage:
    """A usage row to append; the store gives it its id."""

    entry: str
    request_id: str
    ts: datetime
    api_key_id: str
    user_id: str
    model: str
    protocol: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    ttft_ms: int
    outcome: str
    node_id: str
    route_json: str | None = None
    project_id: str = ""
    team_id: str = ""
    org_id: str = ""
    cost_micros: int = 0
    status: int = 0
    served_model: str = ""
    queue_ms: int = 0
    end_user: str = ""
    tags_json: str | None = None
    cache_hit: bool = False
    body_state: str = ""
    guard_action: str = ""
    guard_policy: str = ""
    guard_rule: str = ""
    guard_category: str = ""
    guard_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageRecord(NewUsage):
    """A stored usage row: the appended one with the id the store gave it."""

    id: int


@dataclass(frozen=True, slots=True)
class GuardCount:
    """How many requests since a time one guard policy did one thing to, in one project (``GET /api/v1/guard/events``)."""

    project_id: str
    action: str
    policy: str
    category: str
    count: int


USAGE_COLUMNS = tuple(c.name for c in usage.columns if not c.primary_key)
"""A usage row's columns, in the table's order: :class:`NewUsage`'s fields."""
USAGE_TEXTS = (
    "request_id",
    "api_key_id",
    "user_id",
    "model",
    "protocol",
    "node_id",
    "project_id",
    "team_id",
    "org_id",
    "served_model",
    "end_user",
    "body_state",
    "guard_action",
    "guard_policy",
    "guard_rule",
    "guard_category",
)
"""The columns of short text (at most ``MAX_TEXT`` characters, no NUL) that may be empty."""
USAGE_COUNTS = (
    "prompt_tokens",
    "completion_tokens",
    "latency_ms",
    "ttft_ms",
    "cost_micros",
    "status",
    "queue_ms",
    "guard_ms",
)
"""The columns of whole numbers from 0 to 2^63-1."""
USAGE_JSON = ("route_json", "tags_json")
"""The columns of JSON text or NULL."""
# The others: ``entry`` and ``outcome`` (short text, not blank), ``ts`` (an aware datetime), ``cache_hit`` (a flag).

UsageValues = NewType("UsageValues", dict[str, Any])
"""A usage row's column values by name, checked by :func:`checked_usage`: what :meth:`UsageRepo.append_checked`
stores without checking them again. Other keys it may hold are not stored."""


@dataclass(frozen=True, slots=True)
class Cleaning:
    """What to store instead of a value :func:`checked_usage` does not allow, by kind of column: the ledger's, whose
    rows must not be lost to one bad value. Each returns a value the check allows; ``json`` returns text that is
    checked still (text that is not JSON cannot be mended), or None."""

    text: Callable[[Any, str], str]
    count: Callable[[Any, str], int]
    outcome: Callable[[Any], str]
    json: Callable[[Any, str], str | None]


_TEXT_VALUES = itemgetter("entry", "outcome", *USAGE_TEXTS)
_COUNT_VALUES = itemgetter(*USAGE_COUNTS)
_TEXTS, _COUNTS = frozenset(USAGE_TEXTS), frozenset(USAGE_COUNTS)
_STR, _INT = {str}, {int}
_OTHERS = tuple(name for name in USAGE_COLUMNS if name not in {"entry", "outcome", *_TEXTS, *_COUNTS})


def checked_usage(values: dict[str, Any], cleaning: Cleaning | None = None) -> UsageValues:
    """``values`` (one for each of :data:`USAGE_COLUMNS`; other keys are left alone) checked in place, column by
    column in the table's order (:func:`_checked`). A value the rule does not allow is refused, InvalidInput naming
    the field; with ``cleaning``, replaced by what that gives instead (a bad entry or JSON text is refused either
    way: neither can be made up)."""
    texts, counts = _TEXT_VALUES(values), _COUNT_VALUES(values)
    # The usual row's text and counts pass their rules all at once, in a few built-in calls.
    if (
        set(map(type, texts)) == _STR
        and set(map(type, counts)) == _INT
        and (joined := "".join(texts)).isascii()
        and "\x00" not in joined
        and (len(joined) <= MAX_TEXT or max(map(len, texts)) <= MAX_TEXT)
        and texts[0].strip()
        and texts[1].strip()
        and min(counts) >= 0
        and max(counts) <= INT64_MAX
    ):
        names: tuple[str, ...] = _OTHERS
    else:
        names = USAGE_COLUMNS
    entry = values["entry"]
    for name in names:
        values[name] = _checked(name, values[name], entry, cleaning)
        entry = values["entry"]  # the first column: what follows is named by it as checked
    return UsageValues(values)


def _checked(name: str, value: Any, entry: object, cleaning: Cleaning | None) -> Any:
    """The rule for the usage column ``name``: ``value`` as the column keeps it (``entry`` names the row in a
    refusal). The columns the usual row checks here come first."""
    if name == "ts":
        return aware(value, "usage ts")
    if name in USAGE_JSON:
        value = value if cleaning is None else cleaning.json(value, name)
        return None if value is None else json_arg(value, f"{name} of usage entry {entry!r}")
    if name == "cache_hit":
        return value is True
    if name in _TEXTS:
        return text_arg(value, name, empty=True) if cleaning is None else cleaning.text(value, name)
    if name in _COUNTS:
        return count_arg(value, name) if cleaning is None else cleaning.count(value, name)
    if name == "outcome":
        return text_arg(value, f"outcome of usage entry {entry!r}") if cleaning is None else cleaning.outcome(value)
    if name == "entry":
        return text_arg(value, "usage entry")
    raise AssertionError(f"usage column {name!r} has no rule")


_ROW_VALUES = attrgetter(*USAGE_COLUMNS)


def usage_values(row: NewUsage) -> UsageValues:
    """The row's column values, each checked; InvalidInput naming the first bad field."""
    if not isinstance(row, NewUsage):
        raise InvalidInput(f"a usage row to append must be a NewUsage, not {type(row).__name__}")
    return checked_usage(dict(zip(USAGE_COLUMNS, _ROW_VALUES(row))))


def _record(row: Row[Any]) -> UsageRecord:
    return UsageRecord(**row._mapping)


class UsageRepo(CommitsRepo):
    _appender: LedgerAppender | None = None

    def append_ledger(
        self, rows: Sequence[NewUsage], events: Sequence[NewEvent] = (), *, check_known: bool = True
    ) -> tuple[int, int]:
        """Append usage rows and events in ONE transaction: all of them are stored, or none.

        A row or event whose ``entry`` is already stored is skipped, so appending the same batch
        twice (a journal replayed after a crash) stores it once. Every row is checked first; a
        bad one raises InvalidInput naming the field, and nothing is written; a row the database
        itself refuses (a constraint) raises InvalidInput too. Returns how many usage rows and
        events were new. ``check_known=False`` does not look the entries up first, for rows that
        cannot be stored yet (the live ledger's): they are still stored once, but a known one
        would consume an id on PostgreSQL.
        """
        return self.append_checked([usage_values(row) for row in rows], events, check_known=check_known)

    def append_checked(
        self, rows: Sequence[UsageValues], events: Sequence[NewEvent] = (), *, check_known: bool = True
    ) -> tuple[int, int]:
        """:meth:`append_ledger` for usage rows checked already by :func:`checked_usage` (the ledger's writer, which
        checks each record as it turns it into its row), so each value is checked once; the events are checked here."""
        event_rows = [event_values(row) for row in events]
        return self._ledger_appender().append(rows, event_rows, skip_known=check_known)

    def _ledger_appender(self) -> LedgerAppender:
        """What writes the ledger's usage rows, events and request bodies, on the connections :meth:`_ledger_lender`
        lends; made once per engine."""
        engine = self.engine  # StoreError once the store is closed
        if self._appender is None or self._appender.engine is not engine:
            self._appender = LedgerAppender(engine, usage, events_table, request_bodies, self._ledger_lender())
        return self._appender

    def usage_after(self, after: int, limit: int) -> list[UsageRecord]:
        """Up to ``limit`` usage rows with an id above ``after``, by id."""
        after, limit = page_args(after, limit)
        query = select(usage).where(usage.c.id > after).order_by(usage.c.id).limit(limit)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def delete_usage_before(self, cutoff: datetime, *, limit: int = DELETE_BATCH) -> int:
        """Delete up to ``limit`` usage rows older than ``cutoff``; returns how many went."""
        cutoff = aware(cutoff, "cutoff")
        limit = count_arg(limit, "limit")
        with self._write() as conn:
            return delete_before(conn, usage, cutoff, limit)

    # --- what the guards did: the rows whose guard_action is set ---------------------

    def guard_counts(self, since: datetime) -> list[GuardCount]:
        """Per project, action, policy and category, how many requests since ``since`` a guard was consulted on (those
        it allowed included); the most counted first."""
        since = aware(since, "since")
        c = usage.c
        count = func.count().label("count")
        keys = (c.project_id, c.guard_action, c.guard_policy, c.guard_category)
        query = (
            select(*keys, count)
            .where(c.ts >= since, c.guard_action != "")
            .group_by(*keys)
            .order_by(count.desc(), *keys)
        )
        with self._read() as conn:
            return [GuardCount(*row) for row in conn.execute(query)]

    def guard_events(self, since: datetime, limit: int) -> list[UsageRecord]:
        """The newest ``limit`` requests since ``since`` a guard acted on, newest first: those it only allowed (a
        guardrail webhook's every answer) left out, so they do not hide the ones it blocked, rewrote or flagged."""
        since, limit = aware(since, "since"), count_arg(limit, "limit")
        query = (
            select(usage)
            .where(usage.c.ts >= since, usage.c.guard_action.not_in(("", "allow")))
            .order_by(usage.c.ts.desc(), usage.c.id.desc())
            .limit(limit)
        )
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    # --- reports (opod.store.usage_report) ------------------------------------------

    def usage_by_scope(self, level: str, since: datetime) -> list[ScopeTotals]:
        """Totals per org, team or project (``level``) of the rows since ``since``; rows of no project are left out."""
        since = aware(since, "since")
        with self._read() as conn:
            return scope_totals(conn, usage, level, since)

    def usage_spent_since(self, kind: str, ident: str, since: datetime) -> int:
        """The micros a scope (org, team, project, user or key, by id) spent since ``since``."""
        since = aware(since, "since")
        with self._read() as conn:
            return spent_since(conn, usage, kind, ident, since)

    def usage_export_chunk(
        self, period: str, dims: Sequence[str], start: datetime, end: datetime
    ) -> list[ExportTotals]:
        """One chunk of the export (see :func:`opod.store.usage_report.chunks`): rows in [start, end) by period and dims."""
        start, end = aware(start, "from"), aware(end, "to")
        with self._read() as conn:
            return export_chunk(conn, usage, period, dims, start, end)
