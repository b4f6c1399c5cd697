"""The cursor streams' pages: ``after``/``limit`` checks and ``UsageBatch``/``EventsBatch`` assembly.

Cursor rules: ``limit`` defaults to 500 (also when 0, Go's "not said"), a value over 1000 is
clamped to 1000, a negative or non-integer one is refused; ``after`` is an id ≥ 0. ``next`` is the
last id on the page, or ``after`` when the page is empty; ``more`` says another page is ready now.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from opod.contract.adminapi import (
    EventsBatch,
    LifecycleEvent,
    UsageBatch,
    UsageData,
    UsageEvent,
)
from opod.contract.wire import format_time
from opod.store.events import INT64_MAX, EventRecord
from opod.store.usage import UsageRecord

DEFAULT_LIMIT = 500
MAX_LIMIT = 1000


class CursorError(ValueError):
    """A bad ``after`` or ``limit``; the message is meant for the caller (an HTTP 400 body)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _whole(value: object, field: str, rule: str) -> int:
    if isinstance(value, bool):
        raise CursorError(field, f"{field} must be {rule}, not {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().lstrip("-").isdigit():
        number = int(value.strip())
    else:
        raise CursorError(field, f"{field} must be {rule}, not {value!r}")
    if number < 0:
        raise CursorError(field, f"{field} must be {rule}; {number} is negative")
    return number


def parse_after(value: int | str | None) -> int:
    """The ``after`` query value as an id; None or "" means 0 (from the start)."""
    if value is None or value == "":
        return 0
    after = _whole(value, "after", "a row id ≥ 0 (the `next` of the previous page; 0 to start)")
    if after > INT64_MAX:
        raise CursorError("after", f"after must be a row id ≥ 0 that fits 64 bits, not {after}")
    return after


def parse_limit(value: int | str | None) -> int:
    """The ``limit`` query value: None, "" or 0 → 500; above 1000 → 1000."""
    if value is None or value == "":
        return DEFAULT_LIMIT
    limit = _whole(value, "limit", f"a whole number of rows from 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})")
    if limit == 0:
        return DEFAULT_LIMIT
    return min(limit, MAX_LIMIT)


def usage_batch(records: Sequence[UsageRecord], after: int, limit: int, boot: int) -> UsageBatch:
    """A page from up to ``limit + 1`` records read after ``after`` (the extra one says ``more``)."""
    page = records[:limit]
    events = [
        UsageEvent(
            id=r.id,
            ts=format_time(r.ts),
            data=UsageData(
                api_key_id=r.api_key_id,
                ttft_ms=r.ttft_ms,
                user_id=r.user_id,
                model=r.model,
                protocol=r.protocol,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                latency_ms=r.latency_ms,
                outcome=r.outcome,
                cost_usd=0.0,
                node_id=r.node_id,
                request_id=r.request_id,
                route=json.loads(r.route_json) if r.route_json else None,
            ),
        )
        for r in page
    ]
    return UsageBatch(events=events, next=page[-1].id if page else after, more=len(records) > limit, boot=boot)


def events_batch(records: Sequence[EventRecord], after: int, limit: int, boot: int) -> EventsBatch:
    page = records[:limit]
    events = [
        LifecycleEvent(id=r.id, type=r.type, subject=r.subject, ts=format_time(r.ts), data=json.loads(r.data_json))
        for r in page
    ]
    return EventsBatch(events=events, next=page[-1].id if page else after, more=len(records) > limit, boot=boot)
