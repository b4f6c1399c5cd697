"""Who the fleet's services tell of a change, named: the reconciler woken, lifecycle events emitted.

A service writes the store first, then memory, then tells these; they are built in the leader
(``opod.leader``), above the fleet, and handed down as these protocols.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Reconciling(Protocol):
    """The reconciler (``opod.leader.reconciler.Reconciler``) as a service that changed placement's inputs sees it."""

    def kick(self) -> None:
        """Run a round soon: what should be placed where has changed."""
        ...


class EventSink(Protocol):
    """Where lifecycle events go: ``events(type, subject, data)``, as ``/admin/v1/events/stream`` shows them.

    The leader builds the one sink (``opod.leader.webhooks.fan_out``: the ledger's event stream, and the operator's
    events to the webhooks) and hands it to everyone who emits. A sink may return an awaitable; a caller that can
    wait for it does (``opod.shards.gangs``), the others drop what it returns."""

    def __call__(self, type: str, subject: str, data: Mapping[str, object] | None = None, /) -> object: ...
