"""Group commit: records waiting in memory go to the store in batches, one transaction per batch.

While one batch commits, the next one fills, and the ledger's loop starts a commit no sooner than
``COMMIT_EVERY_S`` after the previous one began (``COMMIT_UNDER_LOAD_S`` under a steady load), so the
batch size follows the load by itself: one row per transaction when idle, up to ``BATCH_MAX`` under load.
A record leaves memory only after its transaction committed; a failed commit leaves it queued (and in the
journal) for the retry.

Commits run in the writer's own thread, scheduled below the event loop (:data:`WRITER_NICE`): a commit is
a burst of CPU (each row checked and turned into parameters, SQLite's pages written) that, on a machine
whose cores the engines and clients share, held up the requests in flight when it ran at the loop's
priority. Below it, the kernel runs the loop first when both are ready, and the commit takes the time the
loop leaves; a commit that waits finds a larger batch (up to ``BATCH_MAX``) the next time, so the writer
keeps up with the load (measured pair by pair: ``python -m bench stages-ab``, ``docs/dataplane.md``).

Every record reaches the store the same way, whether ``Ledger`` built it a moment ago or it was
replayed from the journal (which may hold anything): :func:`commit_records` turns it into its row
(``records.to_row``: an end's values checked once, by the store's rule, and cleaned where they fail it),
and the store writes the batch in one transaction.

A record that cannot be made a row (no entry, JSON that does not parse) is set aside at once. One the
database refuses (a constraint) would block every later one, so a refused batch is retried record by
record, and a record refused on its own is set aside too: moved to ``rejected.jsonl`` beside the
journal, with the reason, and logged; kept for a person to look at, instead of blocking the ledger or
vanishing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from opod.http import cpu
from opod.ledger.records import to_row
from opod.store import InvalidInput, Store
from opod.store.events import NewEvent
from opod.store.usage import UsageValues

log = logging.getLogger("opod.ledger")

BATCH_MAX = 2000
WRITER_NICE = 10
"""How much lower than the event loop's the writer thread's scheduling priority is: Linux's nice, raised for
that thread alone (nice 10 weighs about a tenth of nice 0 when both want a core)."""


def _below_the_loop() -> None:
    """Run in the writer's thread as it starts: lower its priority by :data:`WRITER_NICE`, where the kernel allows
    one thread's own (Linux); elsewhere it keeps the process's. It runs on any of the process's CPUs, not on the
    event loop's alone (:mod:`opod.http.cpu`)."""
    cpu.free_this_thread()
    if not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(os.getpriority(os.PRIO_PROCESS, thread) + WRITER_NICE, 19))
    except OSError as err:
        log.info("ledger: the writer's thread keeps the event loop's priority (%s)", err.strerror)


def commit_records(store: Store, records: Sequence[dict[str, Any]], rejected: Path, *, check_known: bool = True) -> int:
    """Store end and event records in one transaction; refused ones go to ``rejected``.

    Returns how many were new to the store (a replayed record may be there already). Raises
    StoreError when the store cannot be written at all: nothing was stored, retry later.
    ``check_known=False`` for records not yet stored (the live writer's): the store does not
    look their entries up first.
    """
    new = 0
    usage: list[UsageValues] = []
    events: list[NewEvent] = []
    source: dict[int, dict[str, Any]] = {}  # id(row) → its record, to name a refused one
    bad: list[tuple[dict[str, Any], str]] = []
    for record in records:
        try:
            row = to_row(record)
        except ValueError as err:
            bad.append((record, str(err)))
            continue
        source[id(row)] = record
        if isinstance(row, NewEvent):
            events.append(row)
        else:
            usage.append(row)
    try:
        new += sum(store.append_checked(usage, events, check_known=check_known))
    except InvalidInput:
        # One of them is refused: store the others, each on its own, and set that one aside.
        alone: list[tuple[list[UsageValues], list[NewEvent], dict[str, Any]]] = [
            *(([row], [], source[id(row)]) for row in usage),
            *(([], [event], source[id(event)]) for event in events),
        ]
        for usage_row, event_row, record in alone:
            try:
                new += sum(store.append_checked(usage_row, event_row))
            except InvalidInput as err:
                bad.append((record, str(err)))
    for record, why in bad:
        _reject(rejected, record, why)
    return new


def _reject(path: Path, record: dict[str, Any], why: str) -> None:
    log.error("LEDGER: a record was refused (%s); it is kept in %s for a person to look at", why, path)
    line = json.dumps({"refused_at_us": time.time_ns() // 1000, "why": why, "record": record}, default=str) + "\n"
    try:
        # 0600 like the journal beside it: a refused record names a client's key and request.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(line)
    except OSError as err:
        log.error("LEDGER: cannot write %s (%s); the refused record was: %s", path, err.strerror, line.strip())


class Writer:
    def __init__(self, store: Store, rejected: Path, *, batch_max: int = BATCH_MAX) -> None:
        self.store = store
        self.rejected = rejected
        self.batch_max = batch_max
        self._pending: deque[tuple[int, dict[str, Any]]] = deque()
        self.recorded = 0  # sequence number of the last record added
        self.committed = 0  # every record up to this number is in the store
        self.commits = 0  # transactions that stored a batch
        self._lock: asyncio.Lock | None = None
        self._thread = ThreadPoolExecutor(1, "opod ledger writer", initializer=_below_the_loop)
        """Every commit and body write, one at a time, below the event loop's priority."""

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def add(self, record: dict[str, Any]) -> None:
        """Queue one end or event record. The caller serializes calls (the ledger's lock)."""
        self.recorded += 1
        self._pending.append((self.recorded, record))

    async def drain(self, upto: int | None = None, along: Callable[[], None] | None = None) -> bool:
        """Commit until every record up to ``upto`` (default: all added so far) is in the store.

        ``along`` is more blocking work for the store, run in the thread of the first commit once it
        has committed, to spare it a thread hand-off of its own; returns whether it ran (not when
        there was nothing to commit, or the commit failed).

        Raises StoreError when a commit fails; what is not committed stays queued.
        """
        target = self.recorded if upto is None else upto
        if self._lock is None:
            self._lock = asyncio.Lock()
        ran = False
        async with self._lock:
            while self.committed < target and self._pending:
                batch = list(islice(self._pending, self.batch_max))
                then = None if ran else along
                await self.in_thread(partial(_commit, self.store, [record for _, record in batch], self.rejected, then))
                ran = ran or then is not None
                # Only this coroutine (under the lock) removes from the left; add() appends on the right.
                for _ in batch:
                    self._pending.popleft()
                self.committed = batch[-1][0]
                self.commits += 1
        return ran

    async def in_thread(self, work: Callable[[], None]) -> None:
        """Run blocking store work in the writer's thread (after any commit before it)."""
        await asyncio.get_running_loop().run_in_executor(self._thread, work)

    def close(self) -> None:
        """Let the writer's thread go once it is idle; idempotent. Nothing can be committed after."""
        self._thread.shutdown(wait=False)


def _commit(store: Store, records: list[dict[str, Any]], rejected: Path, then: Callable[[], None] | None) -> None:
    commit_records(store, records, rejected, check_known=False)
    if then is not None:
        then()
