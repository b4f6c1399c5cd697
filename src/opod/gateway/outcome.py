"""How one relayed request ended, and who is told: the relay reports, the exchange records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from opod.fleet.router import RouteRecord
from opod.fleet.state import Lease


@dataclass(slots=True)
class Outcome:
    """How one relayed request ended, reported once to its observer (usage, stats, admission)."""

    status: int
    outcome: str
    """``ok``, ``error`` or ``cancelled`` (the client left)."""
    node_id: str = ""
    usage: dict[str, Any] | None = None
    ttft_ms: int = 0
    tokens_sent: int = 0
    working_s: float = 0.0
    """Seconds an engine worked on an answer that never came back (a whole answer its client left):
    its completion tokens are estimated from them."""
    engine_failed: bool = False
    """A live engine answered an error of its own (a 5xx), told the client as a 400: a fault of what served it."""


class RelayObserver(Protocol):
    """One request's bookkeeping, told what the relay does with it (``opod.gateway.exchange.Exchange``)."""

    request_id: str
    started: float
    """``time.perf_counter()`` at the request's arrival: the ``Server-Timing`` header counts from it."""

    def routed(self, record: RouteRecord) -> None:
        """The router chose a worker for the next attempt; ``record`` is its ``Decision.record()``."""

    def leased(self, lease: Lease) -> None:
        """The attempt holds a worker; the request lets the hold go when it ends or moves on to another."""

    def sent(self) -> None:
        """An attempt's request has been written, and its upstream works on it."""

    def answered(self, upstream_s: float) -> None:
        """The attempt that answers took ``upstream_s`` seconds from its request sent to its whole answer (its first
        byte when streamed): the ``upstream`` of the answer's ``Server-Timing``."""

    def streaming(self, tokens_sent: int, node_id: str) -> None:
        """A stream relayed from ``node_id`` has sent ``tokens_sent`` tokens so far (about once a second)."""

    def ended(self, outcome: Outcome) -> None:
        """The request ended (called once, before the client has the end of its answer): what it holds is let go."""
