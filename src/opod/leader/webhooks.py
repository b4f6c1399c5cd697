"""Webhooks: the lifecycle events operators act on, POSTed to the receivers the cluster's settings name.

The leader's ``emit(type, subject, data)`` hands every event to :meth:`Webhooks.offer`, which keeps
those of :data:`OPERATOR_EVENTS` for each receiver whose ``events`` lists the type (an empty list
takes them all). ``offer`` never waits: each receiver has its own bounded lane, so one slow or dead
receiver delays no other and never the emitter; an event that finds its lane full is dropped and
counted. A lane's events go out one at a time, oldest first, each retried with exponential back-off
and jitter on a failure or an answer other than 2xx, up to :attr:`Backoff.attempts`, then logged and
counted as failed. docs/webhooks.md describes the body and the signature a receiver checks.

:class:`LifecycleWatch` is where the leader notices a node lost (it stopped heartbeating, by the one
liveness rule) and a model parked (the reconciler gave up starting it), and emits both.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from opod.fleet.followers import EventSink
from opod.fleet.liveness import HEARTBEAT_MAX_AGE, reachability
from opod.fleet.state import Fleet
from opod.settings.schema import Webhook
from opod.store.offloop import run_sync

log = logging.getLogger("opod.webhooks")

NODE_LOST, MODEL_PARKED, BUDGET_CROSSED, QUOTA_HIT = "node.lost", "model.parked", "budget.crossed", "quota.hit"
OPERATOR_EVENTS = frozenset({NODE_LOST, MODEL_PARKED, BUDGET_CROSSED, QUOTA_HIT})
"""The event types webhooks carry; the leader's other events stay on ``/admin/v1/events/stream`` only."""
TEST_EVENT = "notify.test"
"""What ``POST /api/v1/notify/test`` sends, to every receiver whatever its ``events``."""

SIGNATURE_HEADER, EVENT_HEADER, DELIVERY_HEADER = "X-Opod-Signature", "X-Opod-Event", "X-Opod-Delivery"
STORED_SECRET = "store:"
LANE_SIZE = 256
"""Events waiting for one receiver before new ones are dropped: minutes of a busy fleet's events."""
TIMEOUT = 10.0
"""Seconds one POST may take, connection included."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """``X-Opod-Signature``: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body with the secret>``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def event_body(type: str, subject: str, data: Mapping[str, object] | None, at: datetime | None = None) -> bytes:
    """The JSON a receiver gets: ``{type, subject, at, data}``, ``at`` in RFC 3339 UTC."""
    when = (at or datetime.now(UTC)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps(
        {"type": type, "subject": subject, "at": when, "data": dict(data or {})}, separators=(",", ":"), default=str
    ).encode()


@dataclass(frozen=True, slots=True)
class Backoff:
    """How a failed delivery is tried again: ``first`` seconds, doubling up to ``most``, each delay jittered."""

    attempts: int = 6
    first: float = 1.0
    most: float = 60.0

    def delay(self, failed: int, rng: random.Random) -> float:
        """Seconds before the attempt after the ``failed``-th: half the doubled delay, plus up to as much again at random."""
        base = min(self.most, self.first * 2 ** (failed - 1))
        return base / 2 + rng.uniform(0, base / 2)


@dataclass(slots=True)
class WebhookCounts:
    """What became of the events offered since the leader started."""

    queued: int = 0
    delivered: int = 0
    retried: int = 0
    """Attempts that failed and were tried again."""
    failed: int = 0
    """Events given up on after every attempt failed."""
    dropped: int = 0
    """Events that found their receiver's lane full."""


@dataclass(frozen=True, slots=True)
class _Event:
    id: str
    type: str
    body: bytes
    webhook: Webhook


@dataclass(slots=True)
class _Lane:
    pending: deque[_Event] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    dropping: bool = False
    """Full since the last drop was logged: further drops are counted, not logged, until it has room again."""


SecretReader = Callable[[str], str | None]
"""A stored secret's value by name (blocking: called off the event loop); ``None`` when not stored."""


class Webhooks:
    """Delivers operator events to the receivers ``receivers()`` names now (read at each event, so a settings change holds at once)."""

    def __init__(
        self,
        receivers: Callable[[], Sequence[Webhook]],
        secrets: SecretReader,
        *,
        backoff: Backoff = Backoff(),
        timeout: float = TIMEOUT,
        lane_size: int = LANE_SIZE,
        seed: int | None = None,
    ) -> None:
        self._receivers = receivers
        self._secrets = secrets
        self._backoff = backoff
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._lane_size = lane_size
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self.counts = WebhookCounts()

    # --- the emitter's side: never waits -------------------------------------------------------

    def offer(self, type: str, subject: str, data: Mapping[str, object] | None = None) -> None:
        """Queue ``type`` for every receiver that takes it; from any thread, returning at once, never raising."""
        if type not in OPERATOR_EVENTS:
            return
        try:
            self._queue(type, subject, data)
        except Exception:  # the emitter's own work goes on whatever happens here
            log.exception("webhooks: could not queue %s %s", type, subject)

    def _queue(self, type: str, subject: str, data: Mapping[str, object] | None) -> None:
        receivers = [hook for hook in self._receivers() if not hook.events or type in hook.events]
        if not receivers:
            return
        body = event_body(type, subject, data)
        event_id = uuid.uuid4().hex
        dropped: list[str] = []
        with self._lock:
            for hook in receivers:
                lane = self._lanes.setdefault(hook.url, _Lane())
                if len(lane.pending) >= self._lane_size:
                    self.counts.dropped += 1
                    if not lane.dropping:
                        dropped.append(hook.url)
                    lane.dropping = True
                    continue
                lane.pending.append(_Event(event_id, type, body, hook))
                lane.dropping = False
                self.counts.queued += 1
            loop = self._loop
        for url in dropped:
            log.warning(
                "webhook %s: %s %s dropped, %d events already wait for it (the next drops are only counted)",
                url,
                type,
                subject,
                self._lane_size,
            )
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed while the leader stops
                loop.call_soon_threadsafe(self._wake.set)

    # --- delivery ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; events still waiting then are not sent."""
        self._loop = asyncio.get_running_loop()
        self._wake.set()  # events offered before the loop ran
        try:
            while not stop.is_set():
                waking = asyncio.ensure_future(self._wake.wait())
                stopping = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({waking, stopping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waking.cancel()
                    stopping.cancel()
                self._wake.clear()
                with self._lock:
                    for url, lane in self._lanes.items():
                        if lane.pending and (lane.task is None or lane.task.done()):
                            lane.task = asyncio.create_task(self._drain(lane), name=f"webhook {url}")
        finally:
            with self._lock:
                self._loop = None
                tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._session is not None:
                await self._session.close()
                self._session = None
            counts = self.counts
            if counts.queued or counts.dropped:
                log.info(
                    "webhooks: %d events queued, %d delivered, %d retried, %d failed, %d dropped",
                    counts.queued,
                    counts.delivered,
                    counts.retried,
                    counts.failed,
                    counts.dropped,
                )

    async def _drain(self, lane: _Lane) -> None:
        while True:
            with self._lock:
                if not lane.pending:
                    return
                event = lane.pending.popleft()
            await self._deliver(event)

    async def _deliver(self, event: _Event) -> None:
        url = event.webhook.url
        for attempt in range(1, self._backoff.attempts + 1):
            error = await self._post(event)
            if not error:
                self.counts.delivered += 1
                return
            if attempt == self._backoff.attempts:
                break
            self.counts.retried += 1
            delay = self._backoff.delay(attempt, self._rng)
            log.info(
                "webhook %s: %s attempt %d failed (%s); trying again in %.1f s", url, event.type, attempt, error, delay
            )
            await asyncio.sleep(delay)
        self.counts.failed += 1
        log.warning(
            "webhook %s: gave up on %s %s after %d attempts: %s",
            url,
            event.type,
            event.id,
            self._backoff.attempts,
            error,
        )

    async def _post(self, event: _Event) -> str:
        """One attempt: ``""`` when the receiver answered 2xx, else what went wrong."""
        headers = {"Content-Type": "application/json", EVENT_HEADER: event.type, DELIVERY_HEADER: event.id}
        try:
            secret = await self._secret(event.webhook.secret)
        except LookupError as err:
            return str(err)
        if secret:
            headers[SIGNATURE_HEADER] = signature(secret, int(time.time()), event.body)
        try:
            async with self._client().post(
                event.webhook.url, data=event.body, headers=headers, allow_redirects=False
            ) as answer:
                if 200 <= answer.status < 300:
                    return ""
                text = (await answer.text(errors="replace"))[:200].strip()
                return f"answered {answer.status}" + (f": {text}" if text else "")
        except TimeoutError:
            return f"no answer within {self._timeout.total:g} s"
        except aiohttp.ClientError as err:
            return f"cannot reach it: {err or type(err).__name__}"

    async def _secret(self, value: str) -> str:
        if not value.startswith(STORED_SECRET):
            return value
        name = value.removeprefix(STORED_SECRET)
        stored = await run_sync(self._secrets, name)
        if stored is None:
            raise LookupError(f"its secret {value} is not stored; store it with PUT /api/v1/auth/secrets/{name}")
        return stored

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    # --- notify/test ------------------------------------------------------------------------------

    async def test(self) -> list[tuple[str, str]]:
        """Send a ``notify.test`` event to every receiver now, once each: ``(url, error)``, error ``""`` on 2xx."""
        receivers = list(self._receivers())
        body = event_body(TEST_EVENT, "notify/test", {"message": "a test event from POST /api/v1/notify/test"})
        events = [_Event(uuid.uuid4().hex, TEST_EVENT, body, hook) for hook in receivers]
        errors = await asyncio.gather(*(self._post(event) for event in events))
        if self._loop is None and self._session is not None:  # not running: nothing else will close it
            await self._session.close()
            self._session = None
        return [(hook.url, error) for hook, error in zip(receivers, errors, strict=True)]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def fan_out(*receivers: EventSink) -> EventSink:
    """One ``emit`` that hands each event to every receiver in turn (the ledger, then the webhooks)."""

    def emit(type: str, subject: str, data: Mapping[str, object] | None = None) -> None:
        for receiver in receivers:
            receiver(type, subject, data)

    return emit


class LifecycleWatch:
    """Emits ``node.lost`` when a node stops heartbeating and ``model.parked`` when the reconciler parks a model.

    A node counts as lost on the liveness rule's own transition (:func:`opod.fleet.liveness.reachability`
    turning from heard to not heard); one that said goodbye left in order and is not lost. Each is
    emitted once per transition: a node heard again, or a model retried, can be lost or parked again.
    """

    def __init__(
        self, fleet: Fleet, parked: Callable[[], Sequence[tuple[str, int, str]]], emit: EventSink, *, every: float = 1.0
    ) -> None:
        self._fleet = fleet
        self._parked = parked
        self._emit = emit
        self._every = every
        self._heard: set[str] = set()
        self._parked_models: set[str] = set()

    def look(self, now: float | None = None, wall: float | None = None) -> None:
        """One look at the fleet and the reconciler; emits what changed since the last."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        heard: set[str] = set()
        for node in self._fleet:
            silent_for = wall - node.inventory.last_seen if node.inventory.last_seen else float("inf")
            if not reachability(node, now, silent_for):
                heard.add(node.id)
            elif node.id in self._heard and not node.goodbye:
                silent = now - node.last_heartbeat
                self._emit(
                    NODE_LOST,
                    node.id,
                    {
                        "node": node.id,
                        "address": node.address,
                        "silent_s": round(silent),
                        "reason": f"no heartbeat for {silent:.0f}s (limit {HEARTBEAT_MAX_AGE:.0f}s)",
                    },
                )
        self._heard = heard
        parked = {}
        for model, failures, reason in self._parked():
            parked[model] = (failures, reason)
            if model not in self._parked_models:
                self._emit(MODEL_PARKED, model, {"model": model, "failures": failures, "reason": reason})
        self._parked_models = set(parked)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.look()
            except Exception:  # one bad look must not end the watch
                log.exception("watching for lost nodes and parked models failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every)
