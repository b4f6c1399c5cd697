"""The plan file (``OPOD_PLAN_FILE``): the one model this endpoint serves, its adapters and bounds.

With a plan mounted the gateway serves the plan's model and ``<model>:<adapter>``
for each declared adapter, and nothing else; ``/loadz`` shows the plan's
revision and model. Without one the leader is standalone and nothing is refused.
"""

from __future__ import annotations

from typing import Any

from opod.contract.adminapi import PlanSnapshot
from opod.http.errors import ModelNotFound
from opod.snapshots.parsing import decode
from opod.snapshots.watch import SnapshotError


def validate(plan: PlanSnapshot) -> PlanSnapshot:
    if not plan.model.strip():
        raise SnapshotError("model: empty; name the one model this endpoint serves (a catalog id)")
    if ":" in plan.model:
        raise SnapshotError(f"model: {plan.model!r} holds ':'; adapters go in adapters, served as <model>:<adapter>")
    if plan.revision < 0:
        raise SnapshotError(f"revision: {plan.revision} must be ≥ 0")
    seen: set[str] = set()
    for i, name in enumerate(plan.adapters or []):
        if not name.strip() or ":" in name or any(c.isspace() for c in name):
            raise SnapshotError(f"adapters[{i}]: {name!r} must be a non-empty name without ':' or spaces")
        if name in seen:
            raise SnapshotError(f"adapters[{i}]: {name!r} is listed twice")
        seen.add(name)
    if plan.floor < 0:
        raise SnapshotError(f"floor: {plan.floor} must be ≥ 0 (0 = scale to zero)")
    if plan.max < 0:
        raise SnapshotError(f"max: {plan.max} must be ≥ 0 (0 = no bound)")
    if plan.max and plan.floor > plan.max:
        raise SnapshotError(f"floor: {plan.floor} is above max {plan.max}; lower floor or raise max")
    return plan


class PlanFile:
    """Holds the current plan; pass it to a :class:`~opod.snapshots.watch.FileWatcher`."""

    kind = "plan"

    def __init__(self) -> None:
        self._state: tuple[PlanSnapshot, frozenset[str]] | None = None
        """The plan and the model names it allows, swapped as one object."""

    @property
    def revision(self) -> str | None:
        return str(self._state[0].revision) if self._state is not None else None

    def current(self) -> PlanSnapshot | None:
        """The plan in force, or None for a standalone leader."""
        return self._state[0] if self._state is not None else None

    def loadz(self) -> tuple[int, str]:
        """``(plan_revision, plan_model)`` for ``/loadz``; ``(0, "")`` without a plan."""
        state = self._state
        return (state[0].revision, state[0].model) if state is not None else (0, "")

    def served_models(self) -> frozenset[str] | None:
        """The model names the plan allows, or None when there is no plan (anything goes)."""
        return self._state[1] if self._state is not None else None

    def allows(self, model: str) -> bool:
        served = self.served_models()
        return served is None or model in served

    def check_model(self, model: str) -> None:
        """Raise the gateway's 404 ``model_not_found`` for a model outside the plan."""
        served = self.served_models()
        if served is not None and model not in served:
            raise ModelNotFound(model, sorted(served))

    def parse(self, data: bytes) -> PlanSnapshot:
        return validate(decode(PlanSnapshot, data, "plan file"))

    def apply(self, plan: PlanSnapshot) -> dict[str, Any]:
        served = frozenset([plan.model, *(f"{plan.model}:{a}" for a in plan.adapters or [])])
        self._state = (plan, served)
        return {
            "revision": str(plan.revision),
            "model": plan.model,
            "adapters": list(plan.adapters or []),
            "floor": plan.floor,
            "max": plan.max,
        }
