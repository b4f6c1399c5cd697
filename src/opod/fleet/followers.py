"""Who the fleet's services tell of a change, named: the reconciler woken, lifecycle events emitted.

A service writes the store first, then memory, then tells these; they are built in the leader
(``opod.leader``), above the fleet, and handed down as these protocols.
"""

from __future__ import annotations

from typing import Any, Protocol


class Reconciling(Protocol):
    """The reconciler (``opod.leader.reconciler.Reconciler``) as a service that changed placement's inputs sees it."""

    def kick(self) -> None:
        """Run a round soon: what should be placed where has changed."""
        ...


class EventSink(Protocol):
    """Where lifecycle events go (``opod.leader.webhooks.fan_out``: the ledger's event stream, and the operator's
    events to the webhooks)."""

    def __call__(self, kind: str, subject: str, detail: dict[str, Any], /) -> None: ...
