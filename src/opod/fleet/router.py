"""Choosing the worker for a request, from in-memory state only.

Least loaded first: requests this leader has in flight on the worker plus the
engine's own queue. Workers that tie take turns (a rotation per model), so
equal workers share the load even when it is light; the order is deterministic
for a given sequence of requests.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Collection

from opod.fleet.state import Fleet, NodeState

_turns: dict[str, itertools.count] = {}


def score(node: NodeState) -> float:
    queue = node.load.queue_depth if node.load is not None else 0
    return node.in_flight + queue


def pick(fleet: Fleet, model: str, exclude: Collection[str] = ()) -> NodeState | None:
    """The best live worker holding ``model``, skipping ``exclude``; ``None`` when none can serve."""
    best: list[NodeState] = []
    best_score = 0.0
    for node in fleet.workers_for(model, time.monotonic()):
        if node.id in exclude:
            continue
        value = score(node)
        if not best or value < best_score:
            best, best_score = [node], value
        elif value == best_score:
            best.append(node)
    if not best:
        return None
    if len(best) == 1:
        return best[0]
    turn = next(_turns.setdefault(model, itertools.count()))
    return best[turn % len(best)]
