"""Request bodies kept per the retention settings, written in batches off the request path.

The gateway offers a body once its answer is complete; :meth:`BodyKeeper.offer` never blocks and
never raises: past its bound (bodies or bytes waiting) a body is dropped and counted, since a
slow store must not slow ``/v1``. Bodies are a convenience for inspection and replay, not a
record that must survive a crash (the usage row is that), so they are not journaled.

The ledger's writer writes them in its own rounds (``Ledger.flush``), in the thread of its usage
commit: a thread hand-off of their own, several times a second, cost the event loop more than
writing them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from opod.store import Store
from opod.store.requests import REQUEST_TEXT, RESPONSE_TEXT, BodyRow

log = logging.getLogger("opod.ledger")

MAX_WAITING = 2_000
MAX_WAITING_BYTES = 64 << 20
BATCH = 200
"""Bodies in one statement."""

OfferedBody = tuple[str, str, float, float, str, str, str, int, str, str, bool]
"""A kept body as the gateway offers it: a :data:`BodyRow` whose two times (``at``, ``expires_at``) are POSIX
seconds. The writer's thread makes them the store's UTC times, a batch at a time (:func:`stored`), rather than
each request making two ``datetime`` objects on the event loop."""


def stored(body: OfferedBody) -> BodyRow:
    """``body`` as the store keeps it."""
    at, expires_at = datetime.fromtimestamp(body[2], UTC), datetime.fromtimestamp(body[3], UTC)
    return (body[0], body[1], at, expires_at, body[4], body[5], body[6], body[7], body[8], body[9], body[10])


class BodyKeeper:
    def __init__(
        self,
        store: Store,
        *,
        max_waiting: int = MAX_WAITING,
        max_bytes: int = MAX_WAITING_BYTES,
        offered: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.max_waiting = max_waiting
        self.max_bytes = max_bytes
        self.offered = offered
        """Told of each body queued (the ledger's writer wakes for it)."""
        self.dropped = 0
        """Bodies not kept because the writer was behind, or the store refused them."""
        self.written = 0
        self._counts = threading.Lock()  # the counters: written in the writer's thread, dropped on the loop too
        self._waiting: deque[OfferedBody] = deque()
        self._bytes = 0

    def offer(self, body: OfferedBody) -> bool:
        """Queue ``body`` for the next batch; False (and counted) when the queue is full."""
        size = len(body[REQUEST_TEXT]) + len(body[RESPONSE_TEXT])
        if len(self._waiting) >= self.max_waiting or self._bytes + size > self.max_bytes:
            with self._counts:
                self.dropped += 1
                dropped = self.dropped
            if dropped == 1 or dropped % 1000 == 0:
                log.warning(
                    "ledger: %d request bodies dropped so far: the store is behind (%d waiting)",
                    dropped,
                    len(self._waiting),
                )
            return False
        self._waiting.append(body)
        self._bytes += size
        if self.offered is not None:
            self.offered()
        return True

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def take(self) -> list[OfferedBody]:
        """Every body waiting, off the queue, for :meth:`write`; called where :meth:`offer` is (the event loop)."""
        batch = list(self._waiting)
        self._waiting.clear()
        self._bytes = 0
        return batch

    def write(self, batch: list[OfferedBody]) -> None:
        """Store ``batch`` (blocking: in a thread); a part the store refuses is dropped, counted and said, never raised.

        Not journaled, so not retried forever."""
        for start in range(0, len(batch), BATCH):
            part = batch[start : start + BATCH]
            try:
                written = self.store.keep_body_rows([stored(body) for body in part])
            except Exception as err:
                with self._counts:
                    self.dropped += len(part)
                log.error("ledger: %d request bodies could not be kept (%s); dropped", len(part), err)
                continue
            with self._counts:
                self.written += written

    async def flush(self) -> None:
        """Write every body offered so far, in a thread."""
        batch = self.take()
        if batch:
            await asyncio.to_thread(self.write, batch)
