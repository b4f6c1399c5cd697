"""The one liveness rule: whether a worker takes new work now, and whether it serves a given model.

Two parts. :func:`takes_new_work` is about the worker: reachable, not drained, awake, an
engine that serves. :func:`model_state` adds what is about one served model there: its own
engine process (crashed and restarting, crash-looping, loading, failed to load) and its own
cool-down after failed requests. Health is kept per served model, so one model's crash or
cool-down never takes the worker's other models out.

The router, the 503 a client gets, ``/readyz``, ``/v1/models``, ``opod model ls`` and the
node listings all ask these functions, so they never disagree about a worker or a model.

A node's operator state (:func:`node_state`) is one of ``ready``, ``cordoned`` (no new
replicas; those it has keep serving) and ``draining`` (no new replicas and no new
requests; the placer moves its replicas elsewhere). ``/admin/v1/nodes/{id}/drain`` and
``POST /api/v1/nodes/{id}/state`` set the same state through :func:`state_flags`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from opod.contract.nodeapi import EngineState, EngineStateWord

HEARTBEAT_MAX_AGE = 15.0
"""Three missed heartbeats (every 5 s) and a worker stops taking work."""

RETRY_NODE = 5
"""``Retry-After`` when the worker itself cannot take work (no heartbeat, sleeping, drained)."""
RETRY_RESTARTING = 3
"""An engine that crashed is started again after a second or two of back-off."""
RETRY_CRASH_LOOPING = 15
RETRY_LOADING = 5
RETRY_FAILED = 30
"""A failed load is tried again by the reconciler after its back-off (20 s at first)."""
RETRY_UNKNOWN = 5


@dataclass(slots=True)
class ModelHealth:
    """One served model on one worker, as the relay found it: consecutive failed attempts, and its cool-down."""

    failures: int = 0
    cooldown_until: float = 0.0
    cooled_after: int = 0
    """How many failures in a row set the current cool-down."""
    last_problem: str = ""


class WorkerLiveness(Protocol):
    """What the rule reads of a worker (``opod.fleet.state.NodeState`` has it all)."""

    address: str
    last_heartbeat: float
    engine: EngineState | None
    engine_word: EngineStateWord | None
    sleeping: bool
    drained: bool
    cordoned: bool
    goodbye: bool


class ModelLiveness(WorkerLiveness, Protocol):
    """What the per-model part reads besides: what the worker holds and says of each model, and its health."""

    id: str
    loaded_models: frozenset[str]
    health: dict[str, ModelHealth]
    model_engines: dict[str, EngineState]
    load_errors: dict[str, str]
    load_progress: dict[str, str]


def takes_new_work(node: WorkerLiveness, now: float) -> tuple[bool, str]:
    """``(True, "")`` when the worker may be given new requests, else ``(False, why)``, the engine's own words included.

    Everything :func:`can_place` asks, and an engine that serves, awake. A model's own
    cool-down or crash is not the worker's: :func:`model_state` says that.
    """
    live, why, detail = _worker_state(node, now)
    return live, why + (f": {detail}" if detail else "")


def _worker_state(node: WorkerLiveness, now: float) -> tuple[bool, str, str]:
    """:func:`takes_new_work` with why in opod's words and the engine's own apart (``detail``, for operators only)."""
    placeable, why = can_place(node, now)
    if not placeable:
        return False, why, ""
    word = node.engine_word
    if word is EngineStateWord.CRASH_LOOPING or word is EngineStateWord.STOPPED:
        detail = node.engine.detail if node.engine is not None else ""
        return False, "engine crash-looping" if word is EngineStateWord.CRASH_LOOPING else "engine stopped", detail
    if node.sleeping:
        return False, "sleeping", ""
    return True, "", ""


def can_place(node: WorkerLiveness, now: float) -> tuple[bool, str]:
    """Whether a model may be loaded on the worker now: it is reachable and not drained.

    Looser than :func:`takes_new_work`: a worker whose engines crash-loop or sleep
    can still be given a model to load (the reconciler and moves use this).
    """
    if node.drained:
        return False, "drained"
    if node.cordoned:
        return False, "cordoned"
    if node.goodbye:
        return False, "said goodbye (worker stopped)"
    age = now - node.last_heartbeat
    if age > HEARTBEAT_MAX_AGE:
        return False, f"no heartbeat for {age:.0f}s (limit {HEARTBEAT_MAX_AGE:.0f}s)"
    if not node.address:
        return False, "no address to reach it"
    return True, ""


READY, CORDONED, DRAINING = "ready", "cordoned", "draining"
UNREACHABLE, LOST = "unreachable", "lost"
LOST_AFTER = 300.0
"""Seconds without a word before an unreachable node is lost (it may be forgotten even with replicas on it)."""
STATE_WORDS = {
    "ready": READY,
    "uncordon": READY,
    "cordon": CORDONED,
    "cordoned": CORDONED,
    "drain": DRAINING,
    "draining": DRAINING,
}
"""What ``POST /nodes/{id}/state`` accepts, and the state each word sets."""


def node_state(node: WorkerLiveness) -> str:
    """The operator's state of a node: ``ready``, ``cordoned`` or ``draining``."""
    return DRAINING if node.drained else CORDONED if node.cordoned else READY


def state_flags(state: str) -> tuple[bool, bool]:
    """``(drained, cordoned)`` for a state word of :data:`STATE_WORDS`."""
    word = STATE_WORDS[state]
    return word == DRAINING, word == CORDONED


def reachability(node: WorkerLiveness, now: float, silent_for: float) -> str:
    """``""`` when the node heartbeats, else ``unreachable`` or (silent ``LOST_AFTER`` seconds) ``lost``.

    ``silent_for`` is how long it has not been heard from by the wall clock, which also
    counts before a leader restart (the monotonic ``last_heartbeat`` starts over then).
    """
    if not node.goodbye and node.last_heartbeat and now - node.last_heartbeat <= HEARTBEAT_MAX_AGE:
        return ""
    return LOST if silent_for > LOST_AFTER else UNREACHABLE


def cooling(node: ModelLiveness, model: str, now: float) -> float:
    """Seconds left of ``model``'s cool-down on ``node``; 0 when it is not cooling down."""
    health = node.health.get(model)
    return health.cooldown_until - now if health is not None and health.cooldown_until > now else 0.0


def takes_model(node: ModelLiveness, model: str, now: float) -> bool:
    """Whether ``node`` may be given a request for ``model`` now (the router's question, asked for every request)."""
    return model in node.loaded_models and takes_new_work(node, now)[0] and not cooling(node, model, now)


@dataclass(frozen=True, slots=True)
class ModelState:
    """``model`` on one worker: ``serving``, ``down`` (with why, and when to ask again) or ``absent``.

    ``why`` is in opod's words, fit for any client; ``operators`` says the same with what only operators
    are shown (the engine's last log line, a load error, the last failed request's answer), which may
    name paths and addresses on the worker.
    """

    word: str
    why: str = ""
    retry_after: float = 0.0
    operators: str = ""

    @property
    def told_operators(self) -> str:
        """What the node listings and the leader's log say: ``why`` with the engine's own words."""
        return self.operators or self.why


SERVING = ModelState("serving")
ABSENT = ModelState("absent")


def model_state(node: ModelLiveness, model: str, now: float) -> ModelState:
    """What ``model`` is doing on ``node``: the per-model part of the rule, in words a client is told."""
    held = model in node.loaded_models
    engine = node.model_engines.get(model)
    if not held and engine is None and model not in node.load_progress and model not in node.load_errors:
        return ABSENT
    live, why, detail = _worker_state(node, now)
    if not live:
        return ModelState("down", f"worker {why}", RETRY_NODE, f"worker {why}: {detail}" if detail else "")
    if held:
        left = cooling(node, model, now)
        if left:
            health = node.health[model]
            # Seconds left are the Retry-After's to say: a listing's phrase stays the same while it runs.
            why = f"cooling down after {health.cooled_after} failed requests"
            last = f"{why} (last: {health.last_problem})" if health.last_problem else ""
            return ModelState("down", why, left, last)
        return SERVING
    if model in node.load_errors:
        return ModelState("down", "failed to load", RETRY_FAILED, f"failed to load: {node.load_errors[model]}")
    if engine is not None:
        word = engine.word

        def down(phrase: str, retry_after: float) -> ModelState:
            # ``phrase`` has ``{}`` where the engine's own words go for operators.
            detail = f" ({engine.detail})" if engine.detail else ""
            return ModelState("down", phrase.format(""), retry_after, phrase.format(detail))

        if word is EngineStateWord.CRASH_LOOPING:
            return down(
                f"its engine keeps crashing{{}}, restarted {engine.restarts} times; restarting after a back-off",
                RETRY_CRASH_LOOPING,
            )
        if word is EngineStateWord.STOPPED:
            return down("its engine stopped{} and is not restarted", RETRY_FAILED)
        if word is EngineStateWord.STARTING and (engine.restarts or engine.detail):
            return down("its engine crashed{} and is restarting", RETRY_RESTARTING)
    progress = node.load_progress.get(model)
    return ModelState("down", f"loading ({progress})" if progress else "loading", RETRY_LOADING)


def model_states(node: ModelLiveness, now: float) -> dict[str, str]:
    """Each model ``node`` holds or says anything of: ``serving``, or why not (the node listings' column)."""
    models = sorted({*node.loaded_models, *node.model_engines, *node.load_progress, *node.load_errors})
    out = {}
    for model in models:
        state = model_state(node, model, now)
        out[model] = state.word if state is SERVING else state.told_operators
    return out


@dataclass(slots=True)
class Availability:
    """``model`` across the fleet: the workers serving it, and why each other one that has it cannot."""

    model: str
    serving: list[str] = field(default_factory=list)
    down: list[tuple[str, ModelState]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.serving)

    def why(self) -> str:
        """Why no worker serves it, per worker, in words fit for any client (``n1: its engine crashed and is restarting``)."""
        if not self.down:
            return "no worker holds it yet"
        return "; ".join(f"{node_id}: {state.why}" for node_id, state in self.down)

    def told_operators(self) -> str:
        """:meth:`why` with each worker's detail (``n1: its engine crashed (exit status 1: …) and is restarting``)."""
        if not self.down:
            return self.why()
        return "; ".join(f"{node_id}: {state.told_operators}" for node_id, state in self.down)

    def retry_after(self) -> int:
        """The soonest any worker may serve it again, in whole seconds (at least 1)."""
        soonest = min((state.retry_after for _, state in self.down), default=RETRY_UNKNOWN)
        return max(1, math.ceil(soonest))


def availability(model: str, nodes: Iterable[ModelLiveness], now: float) -> Availability:
    """The one answer to "can ``model`` be served now, and if not, why": the 503, ``/readyz``, listings."""
    out = Availability(model)
    for node in nodes:
        state = model_state(node, model, now)
        if state is SERVING:
            out.serving.append(node.id)
        elif state is not ABSENT:
            out.down.append((node.id, state))
    return out
