"""What holds the fleet's devices now, as placement's questions need it: the reconciler's replicas, or what workers
report loaded where no reconciler tracks them. Read by every answer that asks placement about the fleet as it is
(``explain-placement``, ``target``, ``headroom``, ``plan``).
"""

from __future__ import annotations

from opod.control.context import ReplicaDesk
from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.placed import Held, effective_class
from opod.fleet.placement import Planner
from opod.fleet.state import Fleet

HOLDING = ("starting", "ready", "draining")
"""Replica states that hold devices."""
SERVING = ("starting", "ready")
"""Replica states that count as a model's current capacity."""


def held_now(models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk) -> list[Held]:
    """What holds devices now: the reconciler's replicas with the host memory and cores their profiles reserve.

    Without a reconciler (or for models it does not track), each model a worker reports
    loaded holds that node, without devices.
    """
    out: list[Held] = []
    tracked: set[tuple[str, str]] = set()
    for replica in desk.replica_list():
        if replica.state not in HOLDING:
            continue
        owner = models.get(replica.model)
        profiles = (owner.definition.profiles or []) if owner is not None and owner.definition is not None else []
        profile = profiles[replica.profile] if 0 <= replica.profile < len(profiles) else None
        out.append(
            Held(
                replica_id=replica.id,
                model=replica.model,
                profile=replica.profile,
                klass=replica.klass,
                gpus={node: list(replica.gpus.get(node, [])) for node in replica.nodes},
                memory_gb=float(profile.min_memory_gb or 0) if profile else 0.0,
                cpu_cores=float(profile.cpu_cores or 0) if profile else 0.0,
            )
        )
        tracked.update((replica.model, node) for node in replica.nodes)
    for node in fleet:
        for model_id in sorted(node.loaded_models):
            if (model_id, node.id) not in tracked:
                owner = models.get(model_id)
                klass = (
                    effective_class(owner.definition)
                    if owner is not None and owner.definition is not None
                    else "standard"
                )
                out.append(
                    Held(replica_id=f"{model_id}@{node.id}", model=model_id, profile=0, klass=klass, gpus={node.id: []})
                )
    return out


def current(fleet: Fleet, desk: ReplicaDesk, model: KnownModel) -> int:
    """Replicas of ``model`` starting or ready (the reconciler's), else the workers that report it loaded."""
    mine = [r for r in desk.replica_list() if r.model == model.id]
    if mine:
        return sum(1 for r in mine if r.state in SERVING)
    return sum(1 for node in fleet if model.id in node.loaded_models)


def planner(models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk, now: float) -> tuple[Planner, dict[str, str]]:
    """A planner over the whole fleet as it is, and each held replica's model by replica id."""
    held = held_now(models, fleet, desk)
    return Planner(list(fleet), held, now=now), {h.replica_id: h.model for h in held}
