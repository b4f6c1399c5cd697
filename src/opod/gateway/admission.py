"""Who gets an engine slot when there are not enough: slot pools, classes, fair queues, shedding.

Each model has a pool of slots, sized from what the live workers holding it
report (:func:`fleet_capacity`). A request takes a :class:`Permit` from its
model's pool before it is relayed and gives it back after the answer's last
byte. When a slot is free and no request of an equal or higher class waits
for it, :meth:`Admission.admit` returns at once. Otherwise the request waits in its
class's queue: ``critical`` before ``standard`` before ``sheddable``, fair
sharing between teams inside a class (:mod:`opod.gateway.fairqueue`), each
class held to ``max(1, floor(maxShare × slots))`` slots at once. A request
that may not wait (``holdMs`` 0), finds the queue full (``maxHeld``) or waits
past its hold is shed: :class:`Shed`, a 503 with an estimated ``Retry-After``.

A pool of size 0 (no live worker holds the model) admits everything: the
relay then says which worker is missing, which a queue would only hide.

When the node stops (:meth:`Admission.close`), every later request and every
request still waiting is refused with :class:`Stopping` (503, ``Retry-After``),
while the permits already held run to their end; :meth:`Admission.settled`
says when the last one is given back.

The fleet tells the pools when its slots change (:func:`fleet_capacity`), so a
waiter takes a slot a new or returning worker brings at once; a slow recheck
covers what no event announces (a worker's cooldown running out). Time is read
from a :class:`~opod.gateway.clock.Clock`, the event loop's unless a test gives its own.

Everything runs on the event loop; no locks are needed because nothing here
awaits while the pools are being changed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Self

from opod.contract.adminapi import AdmissionClass, PolicyAdmission
from opod.fleet.state import Fleet
from opod.gateway.clock import LOOP_CLOCK, Clock, Timer
from opod.gateway.fairqueue import FairQueue, Ticket
from opod.http.errors import BadRequest, NoCapacity

CLASS_HEADER = "X-Opod-Class"
CLASSES: tuple[AdmissionClass, ...] = (AdmissionClass.CRITICAL, AdmissionClass.STANDARD, AdmissionClass.SHEDDABLE)
"""Highest rank first; a class's index here is its rank."""
_RANK: dict[str, int] = {str(c): i for i, c in enumerate(CLASSES)}

DEFAULT_SLOTS = 4
"""Slots counted for a worker whose engine does not say how many requests it serves at once."""
DEFAULT_MAX_HELD = 256
"""How many requests may wait at once in one model's pool when the policy says 0."""
RECHECK_S = 1.0
"""How often a pool with waiters looks at the fleet again, for slots no event announced (a cooldown ran out)."""
RETRY_AFTER_MAX = 300
_FIRST_HOLD_GUESS = 2.0
"""Assumed slot hold (seconds) for ``Retry-After`` before any request has come back."""
_HOLD_EWMA = 0.1


class ShedReason(StrEnum):
    NO_HOLD = "no_hold"
    QUEUE_FULL = "queue_full"
    HOLD_EXPIRED = "hold_expired"
    DISPLACED = "displaced"


class Shed(NoCapacity):
    """A request admission turned away: 503 ``no_capacity`` with ``Retry-After``, and why, for metrics."""

    def __init__(self, message: str, retry_after: int, *, model: str, admission_class: str, reason: ShedReason) -> None:
        super().__init__(message, retry_after)
        self.model = model
        self.admission_class = admission_class
        self.reason = reason
        self.retry_after = retry_after


class Stopping(NoCapacity):
    """The node is stopping: it takes no new request, while those in flight finish (503 with ``Retry-After``)."""

    code = "stopping"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, retry_after)
        self.retry_after = retry_after

    def again(self) -> Stopping:
        """A fresh copy to raise: one exception object raised by many requests would pile up their tracebacks."""
        return Stopping(self.message, self.retry_after)


# --- classes ------------------------------------------------------------------


def resolve_class(key_class: str, header: str | None = None) -> AdmissionClass:
    """A request's class: its key's (empty = ``standard``), lowered by ``X-Opod-Class`` but never raised.

    An unknown word in the header is the client's mistake (400); in the key it is a bad key table.
    """
    rank = _RANK.get(key_class or "standard")
    if rank is None:
        raise ValueError(f"admission class {key_class!r} of a key is not one of {', '.join(CLASSES)}")
    if header:
        word = header.strip().lower()
        asked = _RANK.get(word)
        if asked is None:
            raise BadRequest(
                f"{CLASS_HEADER}: {header!r} is not a class; use one of {', '.join(CLASSES)} "
                "(it can lower your key's class, never raise it).",
                param=CLASS_HEADER,
            )
        rank = max(rank, asked)
    return CLASSES[rank]


# --- configuration ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """The policy, resolved per class rank; swapped whole so a reader never sees half of one."""

    hold_s: tuple[float, float, float]
    max_share: tuple[float, float, float]
    """1.0 = no cap."""
    max_held: int

    @classmethod
    def from_policy(cls, policy: PolicyAdmission) -> AdmissionConfig:
        """A listed class uses its own ``holdMs`` (0 = shed at once); an unlisted one the policy's."""
        if policy.hold_ms < 0 or policy.max_held < 0:
            raise ValueError(f"admission holdMs and maxHeld must be ≥ 0 (got {policy.hold_ms}, {policy.max_held})")
        hold = [policy.hold_ms / 1000.0] * 3
        share = [1.0] * 3
        seen: set[str] = set()
        for rule in policy.classes or ():
            if rule.name in seen:
                raise ValueError(f"admission class {rule.name!r} is listed twice in the policy")
            seen.add(rule.name)
            if rule.hold_ms < 0 or not 0.0 <= rule.max_share <= 1.0:
                raise ValueError(
                    f"admission class {rule.name!r}: holdMs must be ≥ 0 and maxShare within 0..1 "
                    f"(got {rule.hold_ms}, {rule.max_share})"
                )
            rank = _RANK[rule.name]
            hold[rank] = rule.hold_ms / 1000.0
            share[rank] = rule.max_share or 1.0
        return cls(tuple(hold), tuple(share), policy.max_held or DEFAULT_MAX_HELD)  # type: ignore[arg-type]

    def cap(self, rank: int, size: int) -> int:
        share = self.max_share[rank]
        return size if share >= 1.0 else max(1, int(share * size))


# --- capacity -----------------------------------------------------------------


class FleetCapacity:
    """model → slots on the live workers holding it, cached for ``ttl`` seconds or until the fleet says its slots changed.

    A worker reporting 0 slots counts ``default_slots``, so a model whose engine
    does not say is never blocked by admission.
    """

    def __init__(
        self, fleet: Fleet, default_slots: int = DEFAULT_SLOTS, ttl: float = 1.0, clock: Clock = LOOP_CLOCK
    ) -> None:
        self.fleet = fleet
        self.default_slots = default_slots
        self.ttl = ttl
        self._now = clock.now
        self._cache: dict[str, tuple[int, float]] = {}
        self._listeners: list[Callable[[], None]] = []
        fleet.on_capacity_change(self._changed)

    def __call__(self, model: str) -> int:
        now = self._now()
        hit = self._cache.get(model)
        if hit is not None and now < hit[1]:
            return hit[0]
        size = sum(node.slots or self.default_slots for node in self.fleet.workers_for(model))
        self._cache[model] = (size, now + self.ttl)
        return size

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after the fleet's slots changed, once the cache has forgotten them."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self._cache.clear()
        for listener in self._listeners:
            listener()


def fleet_capacity(fleet: Fleet, default_slots: int = DEFAULT_SLOTS, ttl: float = 1.0) -> FleetCapacity:
    """The pool sizes an :class:`Admission` reads from ``fleet``, which it follows as the fleet changes."""
    return FleetCapacity(fleet, default_slots, ttl)


# --- permits and waiters ------------------------------------------------------


class Permit:
    """One engine slot of a pool, taken when made and held until :meth:`release` (idempotent); also an async
    context manager.

    Taking the slot and giving it back are counted here, in the pool's tallies (as a worker's
    :class:`~opod.fleet.state.Lease` counts its requests): one call each way on every request's path.
    """

    __slots__ = ("_pool", "rank", "started", "ticket")

    def __init__(self, pool: _Pool, rank: int, ticket: Ticket | None) -> None:
        pool.in_use += 1
        pool.using[rank] += 1
        pool.admitted[rank] += 1
        self._pool: _Pool | None = pool
        self.rank = rank
        self.ticket = ticket
        self.started = pool.owner.now()

    @property
    def admission_class(self) -> AdmissionClass:
        return CLASSES[self.rank]

    @property
    def released(self) -> bool:
        return self._pool is None

    def release(self) -> None:
        """Give the slot back: its hold time counted, its flow's ticket settled, the next waiter served."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        owner = pool.owner
        held_s = owner.now() - self.started
        pool.in_use -= 1
        pool.using[self.rank] -= 1
        pool.mean_hold = held_s if not pool.mean_hold else pool.mean_hold + _HOLD_EWMA * (held_s - pool.mean_hold)
        if self.ticket is not None:
            pool.queues[self.rank].settle(self.ticket, held_s)
        if pool.waiting:
            pool.pump()
        if owner.closed is not None:
            owner.released_while_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class _Waiter(Ticket):
    __slots__ = ("future", "rank", "since", "timer")

    def __init__(self, future: asyncio.Future[Permit], rank: int, since: float) -> None:
        super().__init__()
        self.future: asyncio.Future[Permit] | None = future
        self.rank = rank
        self.since = since
        self.timer: Timer | None = None


# --- the pool -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolStats:
    """One model's pool, for ``/loadz`` and metrics; per-class maps are keyed by class name."""

    model: str
    size: int
    in_use: int
    in_use_by_class: dict[str, int]
    waiting_by_class: dict[str, int]
    admitted_by_class: dict[str, int]
    shed_by_class: dict[str, int]
    shed_by_reason: dict[str, int]
    mean_hold_s: float


class _Pool:
    def __init__(self, owner: Admission, model: str) -> None:
        self.owner = owner
        self.model = model
        self.in_use = 0
        self.using = [0, 0, 0]
        """Slots in use per class rank ("held" is the contract's word for waiting)."""
        self.queues = (FairQueue(), FairQueue(), FairQueue())
        self.waiting = 0
        self.admitted = [0, 0, 0]
        self.shed = [0, 0, 0]
        self.shed_reasons: dict[str, int] = {}
        self.mean_hold = 0.0
        self.recheck: Timer | None = None

    def size(self) -> int:
        return self.owner.capacity(self.model)

    async def wait(self, rank: int, flow: Hashable, size: int) -> Permit:
        config = self.owner.config
        hold = config.hold_s[rank]
        if hold <= 0:
            raise self.shed_error(rank, ShedReason.NO_HOLD, size)
        if self.waiting >= config.max_held and not self.displace(rank, size):
            raise self.shed_error(rank, ShedReason.QUEUE_FULL, size)
        clock = self.owner.clock
        future: asyncio.Future[Permit] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, rank, clock.now())
        self.queues[rank].push(flow, waiter)
        self.waiting += 1
        timer = waiter.timer = clock.call_later(hold, self.expire, waiter)
        if self.recheck is None:
            self.recheck = clock.call_later(RECHECK_S, self.on_recheck)
        try:
            return await future
        except asyncio.CancelledError:
            # The request went away: out of the queue, or, if a slot reached it in the same moment, give it back.
            if not self.withdraw(waiter):
                if future.done() and not future.cancelled() and future.exception() is None:
                    future.result().release()
            raise
        finally:
            timer.cancel()
            # The permit keeps the waiter (its flow's ticket); drop what would make a reference cycle.
            waiter.future = waiter.timer = None

    def withdraw(self, waiter: _Waiter) -> bool:
        if not self.queues[waiter.rank].withdraw(waiter):
            return False
        self.waiting -= 1
        return True

    def expire(self, waiter: _Waiter) -> None:
        if self.withdraw(waiter) and waiter.future is not None and not waiter.future.done():
            waited_ms = (self.owner.now() - waiter.since) * 1000
            waiter.future.set_exception(self.shed_error(waiter.rank, ShedReason.HOLD_EXPIRED, self.size(), waited_ms))

    def displace(self, rank: int, size: int) -> bool:
        """Make room in a full queue by shedding a waiter of a lower class; false when there is none."""
        for lower in (2, 1):
            if lower <= rank:
                break
            victim = self.queues[lower].evict()
            if victim is not None:
                assert isinstance(victim, _Waiter)
                self.waiting -= 1
                if victim.future is not None and not victim.future.done():
                    victim.future.set_exception(self.shed_error(lower, ShedReason.DISPLACED, size))
                return True
        return False

    def pump(self) -> None:
        """Hand free slots to waiters: the highest class below its cap first, fairly inside it."""
        size = self.size()
        config = self.owner.config
        while self.waiting and (size == 0 or self.in_use < size):
            for rank, queue in enumerate(self.queues):
                if queue.waiting and (size == 0 or self.using[rank] < config.cap(rank, size)):
                    break
            else:
                return  # every class with waiters is at its cap
            waiter = queue.pop(self.mean_hold or 1.0)
            assert isinstance(waiter, _Waiter)
            self.waiting -= 1
            if waiter.future is None or waiter.future.done():  # cancelled, its task not yet resumed
                queue.refund(waiter)
                continue
            waiter.future.set_result(Permit(self, rank, waiter))

    def refuse_all(self, refusal: Stopping) -> None:
        """Refuse every waiter: the node is stopping."""
        for queue in self.queues:
            while (waiter := queue.evict()) is not None:
                assert isinstance(waiter, _Waiter)
                self.waiting -= 1
                if waiter.future is not None and not waiter.future.done():
                    waiter.future.set_exception(refusal.again())

    def on_recheck(self) -> None:
        self.recheck = None
        if self.waiting:
            self.pump()
        if self.waiting:
            self.recheck = self.owner.clock.call_later(RECHECK_S, self.on_recheck)

    def retry_after(self, rank: int, size: int) -> int:
        """Seconds until a slot is likely free for this class: the queue ahead of it at the recent pace."""
        ahead = sum(q.waiting for q in self.queues[: rank + 1])
        slots = max(1, min(size, self.owner.config.cap(rank, size))) if size else 1
        seconds = (ahead + 1) * (self.mean_hold or _FIRST_HOLD_GUESS) / slots
        return max(1, min(RETRY_AFTER_MAX, math.ceil(seconds)))

    def shed_error(self, rank: int, reason: ShedReason, size: int, waited_ms: float = 0.0) -> Shed:
        self.shed[rank] += 1
        self.shed_reasons[reason] = self.shed_reasons.get(reason, 0) + 1
        config = self.owner.config
        name = CLASSES[rank]
        retry = self.retry_after(rank, size)
        cap = config.cap(rank, size)
        capped = f", its cap {cap}" if cap < size else ""
        queued = ", ".join(f"{CLASSES[r]} {q.waiting}" for r, q in enumerate(self.queues))
        why = {
            ShedReason.NO_HOLD: f"{name} requests do not wait (holdMs 0)",
            ShedReason.QUEUE_FULL: f"the queue is full (maxHeld {config.max_held})",
            ShedReason.HOLD_EXPIRED: f"it waited {waited_ms:.0f} ms, the {name} hold",
            ShedReason.DISPLACED: "a higher-class request took its place in the full queue",
        }[reason]
        message = (
            f"No free slot for {self.model!r} for a {name} request: {self.in_use}/{size} slots in use "
            f"({name} uses {self.using[rank]}{capped}), {self.waiting} waiting ({queued}); {why}. "
            f"Retry in about {retry} s."
        )
        return Shed(message, retry, model=self.model, admission_class=name, reason=reason)

    def stats(self) -> PoolStats:
        return PoolStats(
            model=self.model,
            size=self.size(),
            in_use=self.in_use,
            in_use_by_class={c: self.using[r] for r, c in enumerate(CLASSES)},
            waiting_by_class={c: self.queues[r].waiting for r, c in enumerate(CLASSES)},
            admitted_by_class={c: self.admitted[r] for r, c in enumerate(CLASSES)},
            shed_by_class={c: self.shed[r] for r, c in enumerate(CLASSES)},
            shed_by_reason=dict(self.shed_reasons),
            mean_hold_s=self.mean_hold,
        )


# --- the front ----------------------------------------------------------------


class Admission:
    """Slot pools for every model, under one admission policy.

    ``capacity(model)`` gives a model's pool size; it is called on every
    admission, so it must be cheap (:func:`fleet_capacity` caches). A
    :class:`FleetCapacity` also says when the sizes change, and the pools
    hand the new slots to waiters at once.
    """

    def __init__(
        self, capacity: Callable[[str], int], policy: PolicyAdmission | None = None, *, clock: Clock = LOOP_CLOCK
    ) -> None:
        self.capacity = capacity
        self.config = AdmissionConfig.from_policy(policy or PolicyAdmission())
        self.clock = clock
        self.now = clock.now
        self._pools: dict[str, _Pool] = {}
        self.closed: Stopping | None = None
        """The refusal every request gets once the node is stopping (:meth:`close`); ``None`` while serving."""
        self._settled: asyncio.Event | None = None
        if isinstance(capacity, FleetCapacity):
            capacity.on_change(self.capacity_changed)

    # --- stopping ---------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once :meth:`close` was called: ``/readyz`` says not ready, every new request is refused."""
        return self.closed is not None

    @property
    def in_flight(self) -> int:
        """Permits held now, over every model: the requests admitted and not yet answered."""
        return sum(pool.in_use for pool in self._pools.values())

    def close(self, retry_after: int, why: str = "the node is stopping") -> int:
        """Take no new request: later ones, and every one waiting now, get :class:`Stopping`.

        Permits already held are untouched, so the answers in flight finish. Returns how many
        requests are in flight. Calling it again changes nothing.
        """
        if self.closed is None:
            retry_after = max(1, min(RETRY_AFTER_MAX, int(retry_after)))
            self.closed = Stopping(
                f"This node is not taking new requests: {why}. Requests in flight finish; "
                f"retry in about {retry_after} s (on another node, if there is one).",
                retry_after,
            )
            for pool in self._pools.values():
                pool.refuse_all(self.closed)
        return self.in_flight

    async def settled(self, timeout: float) -> bool:
        """After :meth:`close`: wait up to ``timeout`` seconds for the last permit to come back; True when none is held."""
        if self.closed is None:
            raise RuntimeError("Admission.settled() waits for the requests in flight after close(); call close() first")
        if self.in_flight == 0:
            return True
        if self._settled is None:
            self._settled = asyncio.Event()
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except TimeoutError:
            return self.in_flight == 0
        return True

    def released_while_closed(self) -> None:
        if self._settled is not None and self.in_flight == 0:
            self._settled.set()

    # --- the policy -------------------------------------------------------------

    def configure(self, policy: PolicyAdmission) -> None:
        """Swap the policy whole; held permits and waiting requests carry on (a waiter keeps its deadline).

        A bad policy raises :class:`ValueError` and changes nothing.
        """
        self.config = AdmissionConfig.from_policy(policy)
        for pool in self._pools.values():
            if pool.waiting:
                pool.pump()  # a raised maxShare may free slots for a capped class now

    def capacity_changed(self, model: str | None = None) -> None:
        """Tell the pools the fleet changed (a heartbeat, a drain), so waiters use new slots at once."""
        pools = self._pools.values() if model is None else [p for p in (self._pools.get(model),) if p is not None]
        for pool in pools:
            if pool.waiting:
                pool.pump()

    def admit_now(self, model: str, admission_class: str = AdmissionClass.STANDARD) -> Permit | None:
        """A slot of ``model``'s pool when this class may have one at once; ``None`` when :meth:`admit` must wait or shed.

        Raises :class:`Stopping` once the node is stopping.
        """
        if self.closed is not None:
            raise self.closed.again()
        pool = self._pools.get(model)
        if pool is None:
            pool = self._pools[model] = _Pool(self, model)
        rank = _RANK.get(admission_class)
        if rank is None:
            raise ValueError(f"admission class {admission_class!r} is not one of {', '.join(CLASSES)}")
        size = self.capacity(model)
        if size == 0:
            return Permit(pool, rank, None)
        if pool.in_use < size:
            if pool.waiting:
                pool.pump()  # slots were added since the last release
            # After a pump, a free slot means every class still waiting is at its cap, so this
            # class has nobody waiting and nobody of a higher class can take the slot.
            if pool.in_use < size and pool.using[rank] < self.config.cap(rank, size):
                return Permit(pool, rank, None)
        return None

    async def admit(
        self, model: str, admission_class: str = AdmissionClass.STANDARD, *, team: str = "", key_id: str = ""
    ) -> Permit:
        """A slot of ``model``'s pool, waiting for one if needed; raises :class:`Shed` when it may not wait.

        Inside a class, requests of one ``team`` share as one flow; a key with no
        team is a flow of its own (``key_id``).
        """
        permit = self.admit_now(model, admission_class)
        return permit if permit is not None else await self.wait(model, admission_class, team=team, key_id=key_id)

    async def wait(
        self, model: str, admission_class: str = AdmissionClass.STANDARD, *, team: str = "", key_id: str = ""
    ) -> Permit:
        """:meth:`admit` after :meth:`admit_now` said ``None``: queue for a slot, or shed."""
        if self.closed is not None:
            raise self.closed.again()
        pool, rank, size = self._pools[model], _RANK[admission_class], self.capacity(model)
        return await pool.wait(rank, ("team", team) if team else ("key", key_id), size)

    def stats(self) -> dict[str, PoolStats]:
        """Per model: slots, in use, waiting, admitted and shed by class, shed by reason."""
        return {model: pool.stats() for model, pool in sorted(self._pools.items())}
