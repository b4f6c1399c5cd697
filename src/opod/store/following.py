"""Following the store: what other leaders of the same store changed is brought into memory every few seconds.

Several leaders share one PostgreSQL store and every one serves ``/v1``; each keeps keys, the
tenancy tree, people and quotas in memory so a request never waits on the store. A follower
re-reads what changed off the request path, in a background task of the leader's lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("opod.store")

FOLLOW_EVERY = 1.0
"""Seconds between reads of the store for what other leaders changed: with the read itself, in force everywhere within 2 s."""


async def follow_store(
    stop: asyncio.Event, step: Callable[[], Awaitable[object]], what: str, every: float = FOLLOW_EVERY
) -> None:
    """Call ``step`` every ``every`` seconds until ``stop``; a failed round is logged and the next one tries again."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            return
        try:
            await step()
        except Exception as err:  # the store away for a moment: keep what is known, try again
            log.warning("cannot read %s from the store: %s", what, err)


__all__ = ["FOLLOW_EVERY", "follow_store"]
