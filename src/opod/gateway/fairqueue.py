"""Fair sharing of engine slots between the flows (teams, or lone keys) of one admission class.

The discipline is fair queueing on *slot-time*, in the manner of a CFS run
queue: each flow counts the slot-seconds its requests have held (its
"attained service"); when a slot frees, the waiting flow that has attained the
least goes next. Deficit round robin with a quantum of one request would share
request *counts*; a slot held by a 30 s generation and one held by a 50 ms
embedding are not the same resource, so counting them alike lets a team with
long answers crowd out a team with short ones. With requests of equal length
the two disciplines agree, and with no timing known yet every request costs
the same, so the queue starts out as a plain round robin between flows.

A request's length is only known when its slot comes back, so a grant charges
the flow an estimate (the mean hold of its recent requests) and the release
settles the difference. A flow that had nothing waiting comes back at the
class's current virtual time: idling banks no credit, and a new flow cannot
starve the old ones. Flows with nothing waiting and nothing held are
forgotten, so a stream of distinct keys does not grow memory.

Picking the next flow scans the flows that have waiters: there are as many as
distinct teams waiting (at most ``maxHeld``), and this runs only when requests
already wait, never on the uncontended path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

_EWMA = 0.2
"""Weight of the newest hold time in a flow's estimate: follows a change of workload in a few requests."""


class Ticket:
    """One waiting request, as the queue sees it; the admission layer subclasses it."""

    __slots__ = ("charge", "flow", "queued")

    def __init__(self) -> None:
        self.flow: Flow | None = None
        self.queued = False
        self.charge = 0.0
        """What the flow was charged when this ticket was granted, settled on release."""


class Flow:
    __slots__ = ("in_flight", "key", "mean", "tickets", "used", "waiting")

    def __init__(self, key: Hashable, used: float) -> None:
        self.key = key
        self.tickets: deque[Ticket] = deque()
        """Waiting tickets in arrival order; withdrawn ones stay until popped (``queued`` false)."""
        self.waiting = 0
        self.used = used
        """Slot-seconds attained (estimates for requests still holding a slot)."""
        self.in_flight = 0
        self.mean = 0.0
        """Mean hold of this flow's recent requests; 0 until one has come back."""


class FairQueue:
    """The waiters of one class in one slot pool."""

    def __init__(self) -> None:
        self.flows: dict[Hashable, Flow] = {}
        self.backlogged: dict[Hashable, Flow] = {}
        """Flows with waiters, in the order they became backlogged (ties go to the earliest)."""
        self.vtime = 0.0
        self.waiting = 0

    def push(self, key: Hashable, ticket: Ticket) -> None:
        flow = self.flows.get(key)
        if flow is None:
            flow = self.flows[key] = Flow(key, self.vtime)
        elif flow.waiting == 0 and flow.used < self.vtime:
            flow.used = self.vtime
        if flow.waiting == 0:
            self.backlogged[key] = flow
        flow.tickets.append(ticket)
        flow.waiting += 1
        self.waiting += 1
        ticket.flow = flow
        ticket.queued = True

    def pop(self, default_cost: float) -> Ticket | None:
        """The next ticket by least attained service, charged an estimate; ``None`` when nobody waits."""
        if not self.waiting:
            return None
        flow = min(self.backlogged.values(), key=_used)
        self.vtime = max(self.vtime, flow.used)
        ticket = _first_queued(flow.tickets)
        self._unqueue(flow, ticket)
        ticket.charge = flow.mean or default_cost
        flow.used += ticket.charge
        flow.in_flight += 1
        return ticket

    def evict(self) -> Ticket | None:
        """The newest ticket of the flow furthest ahead: the one a full queue can best give up."""
        if not self.waiting:
            return None
        flow = max(self.backlogged.values(), key=_used)
        while not flow.tickets[-1].queued:
            flow.tickets.pop()
        ticket = flow.tickets.pop()
        self._unqueue(flow, ticket)
        self._forget_if_idle(flow)
        return ticket

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a waiting ticket out (its hold expired or its request went away); false if it was not waiting."""
        if not ticket.queued:
            return False
        flow = ticket.flow
        assert flow is not None
        self._unqueue(flow, ticket)
        if flow.waiting == 0:
            flow.tickets.clear()  # only withdrawn tickets are left
        self._forget_if_idle(flow)
        return True

    def settle(self, ticket: Ticket, held_s: float) -> None:
        """A granted ticket's slot came back after ``held_s``: replace its estimate with what it used."""
        flow = ticket.flow
        if flow is None:
            return
        ticket.flow = None
        flow.used += held_s - ticket.charge
        flow.mean = held_s if not flow.mean else flow.mean + _EWMA * (held_s - flow.mean)
        flow.in_flight -= 1
        self._forget_if_idle(flow)

    def refund(self, ticket: Ticket) -> None:
        """Undo the charge of a ticket granted to a request that had already gone away."""
        flow = ticket.flow
        if flow is None:
            return
        ticket.flow = None
        flow.used -= ticket.charge
        flow.in_flight -= 1
        self._forget_if_idle(flow)

    def _unqueue(self, flow: Flow, ticket: Ticket) -> None:
        ticket.queued = False
        flow.waiting -= 1
        self.waiting -= 1
        if flow.waiting == 0:
            del self.backlogged[flow.key]

    def _forget_if_idle(self, flow: Flow) -> None:
        if flow.waiting == 0 and flow.in_flight == 0 and self.flows.get(flow.key) is flow:
            del self.flows[flow.key]


def _used(flow: Flow) -> float:
    return flow.used


def _first_queued(tickets: deque[Ticket]) -> Ticket:
    while True:
        ticket = tickets.popleft()
        if ticket.queued:
            return ticket
