"""The placement work of one pass, in this process: ``fleet.placement.Planner`` over N nodes placing 500 models.

What the reconciler's pass does for each model, without its HTTP calls: build one Planner from
the fleet, then for each model (by class, then name) ``place`` it with the nodes that already
hold a replica of it excluded, and ``take`` the assignment. The nodes are the swarm's
(``shape.node_states``), so this isolates what the leader's pass spends on placement.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from bench.fleet_scale import shape
from opod.contract.admin.catalog import CatalogModel
from opod.fleet.placement import Planner


@dataclass(frozen=True)
class PlannerResult:
    nodes: int
    models: int
    seconds: float
    """Median of the repeats: building the Planner and placing every model."""
    build_seconds: float
    placed: int
    fallback: int
    """Replicas placed by the fallback profile (the H100s were full)."""


def run(nodes: int, models: int, repeats: int = 3) -> PlannerResult:
    fleet = shape.node_states(nodes)
    definitions = [(shape.model_name(j), CatalogModel.model_validate(shape.model_definition(j))) for j in range(models)]
    definitions.sort(key=lambda item: item[0])
    totals, builds = [], []
    placed = fallback = 0
    for r in range(repeats):
        started = time.perf_counter()
        planner = Planner(fleet, [])
        built = time.perf_counter()
        placed = fallback = 0
        for name, definition in definitions:
            assignment, _ = planner.place(name, definition, klass="standard", engine=shape.ENGINE, exclude={})
            if assignment is None:
                continue
            planner.take(assignment, f"{name}-r{r}", "standard")
            placed += 1
            fallback += assignment.profile != 0
        totals.append(time.perf_counter() - started)
        builds.append(built - started)
    return PlannerResult(nodes, models, statistics.median(totals), statistics.median(builds), placed, fallback)
