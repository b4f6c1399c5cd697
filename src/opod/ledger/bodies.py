"""Request bodies kept per the retention settings, written in batches off the request path.

The gateway offers a body once its answer is complete; :meth:`BodyKeeper.offer` never blocks and
never raises: past its bound (bodies or bytes waiting) a body is dropped and counted, since a
slow store must not slow ``/v1``. Bodies are a convenience for inspection and replay, not a
record that must survive a crash (the usage row is that), so they are not journaled.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque

from opod.ledger.waiting import wait_any
from opod.store import Store
from opod.store.requests import RequestBody

log = logging.getLogger("opod.ledger")

MAX_WAITING = 2_000
MAX_WAITING_BYTES = 64 << 20
BATCH = 200
IDLE_WAKE_S = 1.0
GATHER_S = 0.1
"""How long a batch gathers bodies before it is written: one transaction for many, where one per body would cost
the store a transaction per request."""


class BodyKeeper:
    def __init__(self, store: Store, *, max_waiting: int = MAX_WAITING, max_bytes: int = MAX_WAITING_BYTES) -> None:
        self.store = store
        self.max_waiting = max_waiting
        self.max_bytes = max_bytes
        self.dropped = 0
        """Bodies not kept because the writer was behind."""
        self.written = 0
        self._waiting: deque[RequestBody] = deque()
        self._bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake: asyncio.Event | None = None

    def offer(self, body: RequestBody) -> bool:
        """Queue ``body`` for the next batch; False (and counted) when the queue is full."""
        size = len(body.request) + len(body.response)
        if len(self._waiting) >= self.max_waiting or self._bytes + size > self.max_bytes:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "ledger: %d request bodies dropped so far: the store is behind (%d waiting)",
                    self.dropped,
                    len(self._waiting),
                )
            return False
        self._waiting.append(body)
        self._bytes += size
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            if threading.get_ident() == self._loop_thread:
                wake.set()
            else:
                loop.call_soon_threadsafe(wake.set)
        return True

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def flush(self) -> None:
        """Write every body offered so far; StoreError when the store refuses."""
        while self._waiting:
            batch = [self._waiting.popleft() for _ in range(min(BATCH, len(self._waiting)))]
            self._bytes -= sum(len(b.request) + len(b.response) for b in batch)
            try:
                self.written += await asyncio.to_thread(self.store.keep_request_bodies, batch)
            except Exception as err:
                # Not journaled, so not retried forever: a batch the store refuses is dropped, and said.
                self.dropped += len(batch)
                log.error("ledger: %d request bodies could not be kept (%s); dropped", len(batch), err)

    async def run(self, stop: asyncio.Event) -> None:
        """Write batches as bodies come, until ``stop``; what is waiting then is written before it returns."""
        self._loop, self._loop_thread, self._wake = asyncio.get_running_loop(), threading.get_ident(), asyncio.Event()
        try:
            while not stop.is_set():
                self._wake.clear()
                if len(self._waiting) < BATCH:
                    await wait_any(GATHER_S, stop)
                await self.flush()
                if not self._waiting:
                    await wait_any(IDLE_WAKE_S, self._wake, stop)
        finally:
            self._loop = self._wake = None
            await self.flush()
