"""The one liveness rule: whether a worker takes new work now.

The router, ``/readyz``, ``/v1/models`` and node listings all call
:func:`takes_new_work`, so they never disagree about a worker.
"""

from __future__ import annotations

from typing import Protocol

from opod.contract.nodeapi import EngineState, EngineStateWord


class WorkerLiveness(Protocol):
    """What the rule reads of a worker (``opod.fleet.state.NodeState`` has it all)."""

    address: str
    last_heartbeat: float
    engine: EngineState | None
    engine_word: EngineStateWord | None
    sleeping: bool
    drained: bool
    goodbye: bool
    cooldown_until: float

HEARTBEAT_MAX_AGE = 15.0
"""Three missed heartbeats (every 5 s) and a worker stops taking work."""


def takes_new_work(node: WorkerLiveness, now: float) -> tuple[bool, str]:
    """``(True, "")`` when the worker may be given new requests, else ``(False, why)``.

    Everything :func:`can_place` asks, and an engine that serves, awake, out of cooldown.
    """
    placeable, why = can_place(node, now)
    if not placeable:
        return False, why
    word = node.engine_word
    if word is not None:
        if word is EngineStateWord.CRASH_LOOPING:
            detail = node.engine.detail if node.engine is not None else ""
            return False, "engine crash-looping" + (f": {detail}" if detail else "")
        if word is EngineStateWord.STOPPED:
            detail = node.engine.detail if node.engine is not None else ""
            return False, "engine stopped" + (f": {detail}" if detail else "")
    if node.sleeping:
        return False, "sleeping"
    if node.cooldown_until > now:
        return False, f"cooling down after failures ({node.cooldown_until - now:.0f}s left)"
    return True, ""


def can_place(node: WorkerLiveness, now: float) -> tuple[bool, str]:
    """Whether a model may be loaded on the worker now: it is reachable and not drained.

    Looser than :func:`takes_new_work`: a worker whose engines crash-loop or sleep
    can still be given a model to load (the reconciler and moves use this).
    """
    if node.drained:
        return False, "drained"
    if node.goodbye:
        return False, "said goodbye (worker stopped)"
    age = now - node.last_heartbeat
    if age > HEARTBEAT_MAX_AGE:
        return False, f"no heartbeat for {age:.0f}s (limit {HEARTBEAT_MAX_AGE:.0f}s)"
    if not node.address:
        return False, "no address to reach it"
    return True, ""
