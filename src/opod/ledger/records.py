"""Journal records: how a request's start and end and a lifecycle event are written, and read back.

Every record is a flat JSON object; ``rec`` says which kind, ``entry`` is the ledger's own key
(unique per ledger instance and counter; the store keeps it UNIQUE, so a replay stores nothing
twice) and ``ts_us`` is unix microseconds.

- ``start``: ``entry, ts_us, request_id, api_key_id, user_id, model, protocol``, and where the
  request belongs to a project ``project_id, team_id, org_id`` (absent = none); ``end_user`` (OpenAI's
  ``user``) and ``tags_json`` (its ``metadata``, JSON object text) where the request gave them;
  the ``pre`` guardrails' outcome (the guard fields below) where they were consulted
- ``end``: the start's fields with the end's ``ts_us``, plus ``outcome, prompt_tokens,
  completion_tokens, latency_ms, ttft_ms, node_id, route_json`` (JSON text or null) and
  ``cost_micros`` (absent = 0), and where known ``status`` (the client's HTTP status), ``served_model``,
  ``queue_ms``, ``cache_hit``, ``body_state``, and ``guard_action, guard_policy, guard_rule,
  guard_category, guard_ms`` (what the guardrails did, ``opod.gateway.guardrails``) (absent = 0, ''
  or false). Complete on its own: a row is built from it without its start.
- ``progress``: ``entry, ts_us, prompt_tokens, completion_tokens, node_id``: how far a stream had
  come (the tokens streamed so far, the prompt estimated from its size), written about once a
  second while it streams, so a crash does not lose what was already sent.
- ``event``: ``entry, ts_us, type, subject, data_json`` (JSON object text)

Recovery: an end becomes its row; a start without an end becomes an ``interrupted`` row (at the
start's time) carrying its last progress (counts 0 without one); an event becomes its event.

Values are cleaned (text cut to the store's limit, NUL and lone surrogates replaced, counts made
whole numbers ≥ 0, names never blank, JSON always an object), because ``end`` runs on the request
path and must never raise, and a value the store would refuse must not block a whole batch later.
Each cleaning is logged, naming the field. Every end and event record, built a moment ago or read
back from the journal (which may hold anything), becomes its store row through :func:`to_row`: an
end's values are checked once, by the store's own rule (``opod.store.usage.checked_usage``), which
cleans a value through :data:`CLEANING` where it fails, and the store takes them as they are (an
event is cleaned here and checked by the store). What a client or a webhook gave
(the end user, the tags, a guardrail's reason) is cleaned on the way in as well, before it is
journaled; the rest is the gateway's own (a request id sanitized at the edge, ids from the key
table, a model resolved against the registry) and is journaled as given. The parameters say what
the gateway passes; a value of another type (a caller's bug the type checker missed) is converted
too, and logged, rather than losing the row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from opod.http import fastjson
from opod.ledger.journal import Line
from opod.store.base import MAX_TEXT
from opod.store.events import INT64_MAX, NewEvent
from opod.store.usage import USAGE_COUNTS, USAGE_JSON, USAGE_TEXTS, Cleaning, UsageValues, checked_usage

log = logging.getLogger("opod.ledger")

OUTCOMES = ("ok", "error", "cancelled", "interrupted")
INTERRUPTED = "interrupted"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_us() -> int:
    return time.time_ns() // 1000


def at_us(ts_us: int) -> datetime:
    # Integer arithmetic: a float of seconds would round some microseconds away.
    return EPOCH + timedelta(microseconds=ts_us)


def text(value: str, name: str) -> str:
    """``value`` as text the store keeps (cut to its length, without NUL or lone surrogates); the change logged."""
    if (
        type(value) is str
        and len(value) <= MAX_TEXT
        and "\x00" not in value
        and (value.isascii() or _encodable(value) is value)
    ):
        return value  # the common case, first and cheap
    if value is None:
        return ""
    cleaned = _encodable((value if isinstance(value, str) else str(value)).replace("\x00", "")[:MAX_TEXT])
    log.warning(
        "ledger: %s %r was stored as %r; pass text of at most %d characters, without NUL or lone surrogates",
        name,
        value,
        cleaned,
        MAX_TEXT,
    )
    return cleaned


def count(value: int, name: str) -> int:
    """``value`` as a whole number from 0 to 2^63-1; the change logged."""
    if type(value) is int and 0 <= value <= INT64_MAX:
        return value
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        number = 0
    number = min(max(number, 0), INT64_MAX)
    log.warning("ledger: %s %r was stored as %d; pass a whole number ≥ 0", name, value, number)
    return number


def _encodable(value: str) -> str:
    """``value`` with any lone surrogate replaced (JSON's "\\ud800" parses into one): the database
    could not encode it. The same object when there is none."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def label(value: str, name: str, default: str) -> str:
    """Text the store requires to be non-blank (an outcome, an event type): ``default`` when it is."""
    cleaned = text(value, name)
    if cleaned.strip():
        return cleaned
    log.warning("ledger: %s %r is blank; stored as %r", name, value, default)
    return default


def outcome(value: str) -> str:
    if value in OUTCOMES:
        return value
    # Kept as given (the wire field is free text), but it is a gateway bug worth seeing.
    log.warning("ledger: outcome %r is not one of %s; stored as given", value, ", ".join(OUTCOMES))
    return label(value, "outcome", "error")


def json_text(value: Mapping[str, object], name: str) -> str:
    """A mapping as compact JSON object text; values JSON cannot hold are written with str()."""
    if type(value) is dict:
        pass  # the gateway's own records: the isinstance checks below cost more than the dump
    elif not isinstance(value, Mapping):
        log.warning('ledger: %s must be a dict, not %s; stored under the key "value"', name, type(value).__name__)
        value = {"value": value}
    elif type(value) is not dict:
        value = dict(value)  # the standard library would write another Mapping with str(), not as an object
    try:
        return fastjson.dumps(value).decode()
    except (ValueError, TypeError) as err:  # a cycle, or keys JSON cannot hold
        log.warning("ledger: %s cannot be written as JSON (%s); stored as its text", name, err)
        return json.dumps({"value": str(value)})


@dataclass(slots=True)
class UsageTicket:
    """One request between ``Ledger.begin`` and ``Ledger.end``."""

    entry: str
    request_id: str
    api_key_id: str
    user_id: str
    model: str
    protocol: str
    started_us: int
    project_id: str = ""
    team_id: str = ""
    org_id: str = ""
    end_user: str = ""
    tags_json: str | None = None
    ended: bool = field(default=False)
    details: Mapping[str, object] | None = None
    """Request record fields known at the start (:func:`request_details`), carried by its end and by an interrupted row."""
    start: dict[str, Any] | None = None
    """Its start record as journaled (:func:`start_record`), made once: its end record is built on it."""


def start_record(ticket: UsageTicket) -> dict[str, Any]:
    record = {
        "rec": "start",
        "entry": ticket.entry,
        "ts_us": ticket.started_us,
        "request_id": ticket.request_id,
        "api_key_id": ticket.api_key_id,
        "user_id": ticket.user_id,
        "model": ticket.model,
        "protocol": ticket.protocol,
    }
    if ticket.project_id or ticket.team_id or ticket.org_id:
        record["project_id"], record["team_id"], record["org_id"] = ticket.project_id, ticket.team_id, ticket.org_id
    if ticket.details:
        record |= ticket.details
    if ticket.end_user:
        record["end_user"] = ticket.end_user
    if ticket.tags_json is not None:
        record["tags_json"] = ticket.tags_json
    return record


def journalable(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with each value JSON cannot hold (a caller's bug the type checker missed) as :func:`text` makes it."""
    return {
        name: value if value is None or isinstance(value, str | int | float) else text(value, name)
        for name, value in record.items()
    }


def finished_record(
    ticket: UsageTicket,
    ts_us: int,
    outcome_: str,
    prompt_tokens: int,
    completion_tokens: int,
    latency_ms: int,
    ttft_ms: int,
    node_id: str,
    route: Mapping[str, object] | None,
    cost_micros: int = 0,
    details: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The end record for ``ticket``: its start record with the end's fields. An outcome that is not one
    of :data:`OUTCOMES` and counts that are not whole numbers in range are logged and cleaned here (the
    usual case checked inline, since this runs for every request); text is the gateway's own
    (``node_id``: a worker's id from the fleet) and :func:`to_row` cleans it with the rest."""
    if not (
        outcome_ in OUTCOMES
        and type(prompt_tokens) is type(completion_tokens) is type(latency_ms) is type(ttft_ms) is int
        # One test for the four whole numbers: their OR is below 0 when one is, past INT64_MAX when one is.
        and 0 <= prompt_tokens | completion_tokens | latency_ms | ttft_ms <= INT64_MAX
    ):
        outcome_ = outcome(outcome_)
        prompt_tokens = count(prompt_tokens, "prompt_tokens")
        completion_tokens = count(completion_tokens, "completion_tokens")
        latency_ms = count(latency_ms, "latency_ms")
        ttft_ms = count(ttft_ms, "ttft_ms")
    start = ticket.start
    # dict(start, **fields) copies the start's table whole and adds the end's: cheaper than merging two dicts.
    record = dict(
        start if start is not None else start_record(ticket),
        rec="end",
        ts_us=ts_us,
        outcome=outcome_,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        node_id=node_id,
        route_json=None if route is None else json_text(route, "route"),
    )
    if cost_micros:
        record["cost_micros"] = cost_micros
    if details:
        details = request_details(details)
        started = ticket.details
        if started and "guard_action" in details and not details.keys() >= started.keys():
            # The end's guard outcome is whole: a guard field of the start's it leaves out (no reason given)
            # goes; those it has replace the start's below.
            for name in started:
                if name not in details and name in GUARD_NAMES:
                    record.pop(name, None)
        record |= details
    return record


GUARD_FIELDS = ("guard_action", "guard_policy", "guard_rule", "guard_category", "guard_ms")
GUARD_NAMES = frozenset(GUARD_FIELDS)
DETAIL_COUNTS = ("status", "queue_ms", "guard_ms")
DETAIL_TEXTS = ("served_model", "body_state", "guard_action", "guard_policy", "guard_rule", "guard_category")
DETAIL_NAMES = frozenset((*DETAIL_COUNTS, *DETAIL_TEXTS, "cache_hit"))
GIVEN_DETAILS = frozenset(("guard_category",))
"""The details a webhook gave (a guardrail's reason): cleaned on the way in; the gateway's own are cleaned by :func:`to_row`."""


def request_details(details: Mapping[str, object]) -> Mapping[str, object]:
    """The request record fields (``status``, ``served_model``, ``queue_ms``, ``cache_hit``,
    ``body_state``, the guard fields); unknown names are dropped and logged, and what a webhook gave is cleaned.
    ``details`` itself in the usual case (the gateway's own dict, of known names, its guardrail's reason clean)."""
    if type(details) is dict and DETAIL_NAMES.issuperset(details):
        category = details["guard_category"] if "guard_category" in details else None
        if category is None or (
            type(category) is str and len(category) <= MAX_TEXT and category.isascii() and "\x00" not in category
        ):
            return details
    out: dict[str, Any] = {}
    for name, value in details.items():
        if name in DETAIL_NAMES:
            out[name] = text(value, name) if name in GIVEN_DETAILS else value  # type: ignore[arg-type]
        else:
            log.warning(
                "ledger: request detail %r is not one of %s; dropped",
                name,
                ", ".join((*DETAIL_COUNTS, *DETAIL_TEXTS, "cache_hit")),
            )
    return out


def progress_record(
    ticket: UsageTicket, ts_us: int, prompt_tokens: int, completion_tokens: int, node_id: str
) -> dict[str, Any]:
    return {
        "rec": "progress",
        "entry": ticket.entry,
        "ts_us": ts_us,
        "prompt_tokens": count(prompt_tokens, "prompt_tokens"),
        "completion_tokens": count(completion_tokens, "completion_tokens"),
        "node_id": text(node_id, "node_id"),
    }


def interrupted_record(start: dict[str, Any], progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row of a request the leader never saw end: as far as its last progress record says it got."""
    zeros = {"prompt_tokens": 0, "completion_tokens": 0, "latency_ms": 0, "ttft_ms": 0}
    record = {**start, "rec": "end", "outcome": INTERRUPTED, **zeros, "node_id": "", "route_json": None}
    if progress is not None:
        record.update(
            prompt_tokens=progress.get("prompt_tokens", 0),
            completion_tokens=progress.get("completion_tokens", 0),
            node_id=progress.get("node_id", ""),
            route_json=json.dumps({"prompt_tokens": "estimated"}),
        )
    return record


def event_record(entry: str, ts_us: int, type: str, subject: str, data_json: str) -> dict[str, Any]:
    return {"rec": "event", "entry": entry, "ts_us": ts_us, "type": type, "subject": subject, "data_json": data_json}


def to_row(record: dict[str, Any]) -> UsageValues | NewEvent:
    """The store row for an end or event record, built a moment ago or read back from the journal. An end becomes
    its usage row's column values, checked once by the store's rule with :data:`CLEANING` (a value it does not
    allow is cleaned and logged), so the store takes them as they are; an event is cleaned here and checked by
    the store. ValueError when the record is not one, InvalidInput for what cannot be cleaned (its entry, JSON)."""
    kind, entry, ts_us = record.get("rec"), record.get("entry"), record.get("ts_us")
    if not isinstance(entry, str) or not entry or type(ts_us) is not int:
        raise ValueError("a record needs an entry (text) and ts_us (unix microseconds)")
    if kind == "end":
        return checked_usage({**ABSENT, **record, "ts": at_us(ts_us)}, CLEANING)
    if kind != "event":
        raise ValueError(f"rec {kind!r} is neither an end nor an event")
    get = record.get
    return NewEvent(
        entry=entry,
        ts=at_us(ts_us),
        type=label(get("type", ""), "event type", "unknown"),
        subject=text(get("subject", ""), "event subject"),
        data_json=_json_field(get("data_json") or "{}"),
    )


ABSENT: dict[str, Any] = {
    **dict.fromkeys(USAGE_TEXTS, ""),
    **dict.fromkeys(USAGE_COUNTS, 0),
    **dict.fromkeys(USAGE_JSON),
    "outcome": "",
    "cache_hit": False,
}
"""What an end record that leaves a column out stores (an outcome left out is cleaned to ``error``)."""


def _json_field(value: Any) -> Any:
    """JSON text read from the journal, left for the store to check; a lone surrogate in it (only a
    damaged journal holds one) is replaced, since the database could not encode it."""
    return _encodable(value) if isinstance(value, str) else value


def _json_or_none(value: Any, name: str) -> str | None:
    """An end's JSON field: its text as :func:`_json_field` leaves it; anything else is none."""
    return _json_field(value) if isinstance(value, str) else None


CLEANING = Cleaning(text=text, count=count, outcome=partial(label, name="outcome", default="error"), json=_json_or_none)
"""How an end record's value the store would refuse is stored instead: cleaned, and logged naming the field."""


@dataclass(slots=True)
class Recovered:
    records: list[dict[str, Any]]  # ends (real and interrupted) and events, oldest first
    ended: int = 0
    interrupted: int = 0
    events: int = 0


def _ts_us(record: dict[str, Any]) -> int:
    ts_us = record.get("ts_us")
    return ts_us if type(ts_us) is int else 0


def recover(lines: Iterable[Line]) -> Recovered:
    """What the journal says must be in the store. A record seen twice (a start carried into a
    newer segment, a segment replayed twice) counts once."""
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    events: dict[str, dict[str, Any]] = {}
    progress: dict[str, dict[str, Any]] = {}
    for line in lines:
        record, entry = line.record, line.record.get("entry")
        kind = record.get("rec")
        if not isinstance(entry, str) or kind not in ("start", "end", "event", "progress"):
            log.error(
                "ledger journal %s line %d is not a start, end, progress or event; skipped", line.segment, line.number
            )
            continue
        if kind == "progress":
            # The furthest a stream got: a progress record carried into a newer segment may come again.
            seen = progress.get(entry)
            if seen is None or _ts_us(record) >= _ts_us(seen):
                progress[entry] = record
            continue
        {"start": starts, "end": ends, "event": events}[kind].setdefault(entry, record)
    interrupted = [
        interrupted_record(start, progress.get(entry)) for entry, start in starts.items() if entry not in ends
    ]
    records = sorted([*ends.values(), *interrupted, *events.values()], key=_ts_us)
    return Recovered(records, ended=len(ends), interrupted=len(interrupted), events=len(events))
