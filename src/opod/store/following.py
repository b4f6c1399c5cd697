"""Following the store: what other leaders of the same store changed is brought into memory within 2 s.

Several leaders share one PostgreSQL store and every one serves ``/v1``; each keeps keys, the tenancy tree,
people, quotas and the settings in memory so a request never waits on the store. Each of those has a
follower, a read of what changed; one loop, :class:`Following`, runs them off the request path. It asks the
store every :data:`FOLLOW_EVERY` seconds whether anything was committed since (:meth:`Store.commit_mark`,
a pragma, or a count of notices) and runs only the followers that have not read since then: a store nobody
writes to is not read at all. A leader's own writes count as changes too, except the ledger's usage rows, events
and request bodies and the times no follower reads (a key's last use, a node's last heartbeat), so a leader busy
serving and nothing else reads nothing (:mod:`opod.store.commits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol

from opod.store.offloop import run_sync

log = logging.getLogger("opod.store")

FOLLOW_EVERY = 1.0
"""Seconds between looks at the store for what other leaders changed: with the read itself, in force everywhere
within 2 s."""

Follower = Callable[[], Awaitable[object]]
"""A read of one part of the store into memory; raises :class:`StaleRead` when it dropped its read."""

_NEVER = object()
"""The mark of a follower that has not read yet: equal to none, so its first look reads."""


class StaleRead(Exception):
    """A follower's read overlapped a change made here and was dropped (it may be older than that change): the
    follower is run again at the next look, whether or not anything else is committed by then."""


class CommitMarks(Protocol):
    """The store's side :class:`Following` asks (``opod.store.Store`` is one)."""

    def commit_mark(self) -> Hashable: ...


class _Followed:
    __slots__ = ("what", "read", "mark")

    def __init__(self, what: str, read: Follower) -> None:
        self.what = what
        self.read = read
        self.mark: Hashable = _NEVER
        """The store's commit mark taken before this follower's last read that went through."""


class Following:
    """The one owner of following the store: its followers run only when the store has changed since their last read."""

    def __init__(self, store: CommitMarks, every: float = FOLLOW_EVERY) -> None:
        self._store = store
        self._every = every
        self._followers: list[_Followed] = []

    def add(self, what: str, read: Follower) -> None:
        """Follow the store with ``read`` (``what`` names it in the log); its first look reads."""
        self._followers.append(_Followed(what, read))

    async def look(self) -> list[str]:
        """Run the followers that have not read since the store's last commit, side by side; the names of those run.

        The mark is taken before the reads, so a change committed during one makes the next look read again. A
        follower that failed or dropped a stale read keeps its old mark and is run again at the next look.
        """
        store = self._store
        mark = await run_sync(store.commit_mark)  # it may wait for the ledger's transaction, or make a round trip
        due = [f for f in self._followers if f.mark != mark]
        if not due:
            return []
        results = await asyncio.gather(*(f.read() for f in due), return_exceptions=True)
        for follower, result in zip(due, results, strict=True):
            if isinstance(result, StaleRead):
                log.debug("%s read again at the next look: %s", follower.what, result)
            elif isinstance(result, Exception):  # the store away for a moment: keep what is known, try again
                log.warning("cannot read %s from the store: %s", follower.what, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                follower.mark = mark
        return [f.what for f in due]

    async def run(self, stop: asyncio.Event) -> None:
        """Look every :data:`FOLLOW_EVERY` seconds until ``stop``; a failed look is logged and the next one tries."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every)
            if stop.is_set():
                return
            try:
                await self.look()
            except Exception as err:
                log.warning("cannot tell whether the store changed: %s", err)


__all__ = ["FOLLOW_EVERY", "CommitMarks", "Follower", "Following", "StaleRead"]
