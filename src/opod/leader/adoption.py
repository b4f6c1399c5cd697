"""A restarted leader takes on the replicas its workers still run, instead of placing them again.

Replicas are not stored: what workers report is the one record of what runs. Each load names
its replica (id, profile index, definition digest, devices, rank; :func:`opod.leader.replicas.load_requests`)
and the worker repeats it for every engine in each heartbeat (``Heartbeat.replicas``). A replica a
worker reports at rank 0 that the leader does not track is adopted under its own id with the GPUs
it holds (:func:`reported`), with its other ranks found by id. A pinned load names no replica and
stays :mod:`opod.leader.pinned`'s; a replica this leader stopped is never adopted back from a late
heartbeat. While nodes the store knows have not reported since the start (:func:`awaiting_reports`)
the reconciler places nothing new, so what they run is adopted rather than started twice. A stored
copy would be wrong as soon as an engine ended while the leader was down.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping

from opod.catalog.definition import class_in_force
from opod.contract import nodeapi
from opod.contract.admin.catalog import CatalogModel
from opod.contract.wire import parse_time
from opod.fleet.liveness import HEARTBEAT_MAX_AGE
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.leader.replicas import ACTIVE, READY, STARTING, Replica

STALE = "unknown"
"""The digest of a replica whose definition is not known: equal to no definition's, so it shows stale."""
SEEN_RECENTLY = 600.0
"""A node the store saw within this many seconds before a leader's start is waited for (:func:`awaiting_reports`)."""


def reported(
    fleet: Fleet,
    models: ModelRegistry,
    known: Mapping[str, Replica],
    stopped: Collection[str],
    *,
    now: float,
    starting: bool,
) -> list[Replica]:
    """The replicas workers report running that ``known`` lacks (and that were not ``stopped`` here), as tracked from now on.

    ``starting``: the leader started within a heartbeat age, so a rank whose node has not reported
    yet is waited for rather than left out.
    """
    wall = time.time()
    covered = {(r.model, n) for r in known.values() if r.state in ACTIVE for n in r.nodes}
    found: list[Replica] = []
    for node in fleet:
        if not node.replicas or node.goodbye or now - node.last_heartbeat > HEARTBEAT_MAX_AGE:
            continue
        for model_id, held in node.replicas.items():
            if held.rank != 0 or not held.replica or held.replica in known or held.replica in stopped:
                continue
            model = models.get(model_id)
            definition = model.definition if model is not None else None
            if definition is None or definition.external is not None:
                continue  # a pinned load's, or a model no longer defined: :mod:`opod.leader.pinned` owns it
            if (model_id, node.id) in covered:
                continue  # the engine there is a replica this leader tracks already
            ranks = _ranks(fleet, model_id, node, held, now, starting=starting)
            if ranks is not None:
                found.append(
                    adopted(model_id, definition, ranks, serving=model_id in node.loaded_models, now=now, wall=wall)
                )
    return found


def _ranks(
    fleet: Fleet, model_id: str, head: NodeState, held: nodeapi.HeldReplica, now: float, *, starting: bool
) -> list[tuple[NodeState, nodeapi.HeldReplica]] | None:
    """Every node reporting a rank of rank 0's replica, in rank order; ``None`` while one may still report."""
    if held.ranks <= 1:
        return [(head, held)]
    found = {0: (head, held)}
    for node in fleet:
        other = node.replicas.get(model_id)
        if (
            node is not head
            and other is not None
            and other.replica == held.replica
            and now - node.last_heartbeat <= HEARTBEAT_MAX_AGE
        ):
            found.setdefault(other.rank, (node, other))
    if len(found) < held.ranks and starting:
        return None  # a rank's node has not reported since this leader started
    return [found[rank] for rank in sorted(found)]


def adopted(
    model: str,
    definition: CatalogModel,
    ranks: list[tuple[NodeState, nodeapi.HeldReplica]],
    *,
    serving: bool,
    now: float,
    wall: float,
) -> Replica:
    """The replica that workers report running (rank order), as this leader tracks it from now on.

    ``ready`` when rank 0 serves it, else ``starting`` (its load was still under way);
    its age is rank 0's engine's, as the worker says it. A profile the definition no
    longer has reads as profile 0 and the replica is stale (its digest differs).
    """
    head, held = ranks[0]
    profiles = definition.profiles or []
    index = held.profile if held.profile < len(profiles) else 0
    profile = profiles[index] if index < len(profiles) else None
    age = engine_age(head, model, wall) if serving else 0.0
    replica = Replica(
        id=held.replica,
        model=model,
        profile=index,
        profile_name=profile.name if profile is not None and profile.name else str(index),
        klass=class_in_force(definition),
        nodes=[node.id for node, _ in ranks],
        gpus={node.id: list(h.devices or []) for node, h in ranks},
        state=READY if serving else STARTING,
        started=now - age,
        started_wall=wall - age,
        fingerprint=held.fingerprint
        if held.fingerprint and (held.profile < len(profiles) or held.profile == 0)
        else STALE,
        cpu_cores=float(profile.cpu_cores or 0) if profile else 0.0,
        memory_gb=float(profile.min_memory_gb or 0) if profile else 0.0,
    )
    if serving:
        replica.ready_at, replica.ever_ready = now, True
    return replica


def awaiting_reports(nodes: Iterable[NodeState]) -> bool:
    """A node the store knows, seen lately, has not sent a heartbeat to this leader yet.

    Its engines keep serving across a leader restart: placing replicas before it
    reports them would start engines that are not needed, and stop them again.
    """
    recent = time.time() - SEEN_RECENTLY
    return any(n.last_heartbeat == 0.0 and n.inventory.last_seen > recent for n in nodes)


def engine_age(node: NodeState, model: str, now_wall: float) -> float:
    """Seconds the worker's engine of ``model`` has been serving, as its heartbeat says; 0 when it does not say."""
    state = node.model_engines.get(model)
    if state is None or state.state != "serving" or not state.since:
        return 0.0
    try:
        since = parse_time(state.since)
    except ValueError:
        return 0.0
    return max(now_wall - since.timestamp(), 0.0)
