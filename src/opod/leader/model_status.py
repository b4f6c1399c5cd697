"""A model's state in words, for listings (``opod model ls``, ``/api/v1/model-states``, ``opod up``'s console): the
words a client's 503 uses (``Fleet.availability``), and for a defined model its replicas' state."""

from __future__ import annotations

from opod.catalog.definition import scaling_in_force
from opod.fleet.models import KnownModel
from opod.fleet.state import Fleet
from opod.leader.pinned import PinnedLoads
from opod.leader.replicas import FAILED, STARTING, Parking, Replica


def status(
    model_id: str,
    model: KnownModel | None,
    fleet: Fleet,
    pinned: PinnedLoads,
    parking: Parking | None,
    replicas: list[Replica],
) -> str:
    """A short phrase for listings, in the words a client's 503 uses (``Fleet.availability``).

    ``serving on n1`` (and why any other holder cannot, in brackets), ``failed on n1: …``
    when a load was refused, ``cannot serve: n1: its engine crashed (…) and is restarting``,
    ``loading on n1 (…)``, ``waiting for a worker`` or ``not loaded``; for a defined model also
    ``parked after 3 failed starts: …``, ``starting on n1``, ``cannot be placed`` and ``on demand``.
    """
    availability = fleet.availability(model_id)
    if availability.ok:
        others = f" ({availability.told_operators()})" if availability.down else ""
        return "serving on " + ", ".join(availability.serving) + others
    if model is not None and model.definition is not None:
        return _replica_status(model, fleet, parking, replicas)
    pending = pinned.attempts_of(model_id)
    failed = [a for a in pending if a.error]
    if failed:
        return f"failed on {failed[0].node_id}: {failed[0].error}"
    if any(state.word == "down" and not state.why.startswith("loading") for _, state in availability.down):
        return f"cannot serve: {availability.told_operators()}"
    if pending:
        parts = []
        for attempt in pending:
            node = fleet.get(attempt.node_id)
            progress = node.load_progress.get(model_id, "") if node is not None else ""
            parts.append(attempt.node_id + (f" ({progress})" if progress else ""))
        return "loading on " + ", ".join(parts)
    if availability.down:
        return f"cannot serve: {availability.told_operators()}"
    if model is not None and model.wants_loaded():
        return "waiting for a worker"
    return "not loaded"


def _replica_status(model: KnownModel, fleet: Fleet, parking: Parking | None, replicas: list[Replica]) -> str:
    failed = sorted((r for r in replicas if r.state == FAILED), key=lambda r: r.started)
    where = f"failed on {'+'.join(failed[-1].nodes)}: " if failed else "failed to start: "
    if parking is not None and parking.parked:
        return f"parked after {parking.failures} failed starts ({where}{parking.reason}); `opod ctl models retry {model.id}` tries again"
    starting = [r for r in replicas if r.state == STARTING]
    if starting:
        parts = []
        for replica in starting:
            node = fleet.get(replica.nodes[0])
            progress = node.load_progress.get(model.id, "") if node is not None else ""
            parts.append("+".join(replica.nodes) + (f" ({progress})" if progress else ""))
        return "starting on " + ", ".join(parts)
    if model.status.unplaceable:
        if not fleet.placeable():
            return "waiting for a worker"  # nothing to place on is not a placement failure
        return "cannot be placed now (explain-placement says why)"
    if parking is not None and parking.failures:
        return where + parking.reason
    if model.status.desired == 0:
        if model.definition is not None and scaling_in_force(model.definition)[3]:
            return "on demand: starts when a request asks for it"
        return "not loaded (opod model load starts it)"
    return "waiting for a worker"
