"""Retention by age only: rows older than ``OPOD_USAGE_RETENTION_DAYS`` (default 30) are deleted.

Never by count or by what a consumer has read: a manager that lags keeps every row it has not
read yet, for as long as the retention lasts. The writer calls :func:`prune` now and then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from opod import config
from opod.store import Store

ENV = "OPOD_USAGE_RETENTION_DAYS"
DEFAULT_DAYS = 30
MAX_DAYS = 100 * 366  # past this a datetime subtraction would leave the calendar


def retention_days(environ: Mapping[str, str] | None = None) -> timedelta:
    """How long rows are kept; ValueError naming the variable when its value is unusable."""
    value = config.read(ENV, environ)
    if value is None:
        return timedelta(days=DEFAULT_DAYS)
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_DAYS:
        raise ValueError(
            f"{ENV}={value!r} is not a number of days; set a whole number from 1 to {MAX_DAYS}, or unset it for {DEFAULT_DAYS}"
        )
    return timedelta(days=int(value))


@dataclass(frozen=True, slots=True)
class Pruned:
    usage: int
    events: int
    bodies: int = 0
    """Request bodies past their own ``expires_at`` (the settings' ``retention.bodies_days`` when kept)."""


def _prune(store: Store, cutoff: datetime, now: datetime | None = None) -> Pruned:
    # Small batches, each its own transaction, so the writer's appends never wait long.
    usage = events = 0
    while (gone := store.delete_usage_before(cutoff)) > 0:
        usage += gone
    while (gone := store.delete_events_before(cutoff)) > 0:
        events += gone
    bodies = 0
    while (gone := store.delete_request_bodies_expired(now or datetime.now(UTC))) > 0:
        bodies += gone
    return Pruned(usage, events, bodies)


async def prune(store: Store, keep: timedelta, now: datetime | None = None) -> Pruned:
    """Delete usage rows and events older than ``now - keep``; off the event loop."""
    now = now or datetime.now(UTC)
    return await asyncio.to_thread(_prune, store, now - keep, now)
