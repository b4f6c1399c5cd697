"""The fleet as the leader sees it, in memory: workers, what they hold, how busy they are.

Rebuilt from registrations and heartbeats; the request path reads only this,
never the store. The relay's failed attempts are counted per served model on a
worker (its engine process), never per worker: three in a row set that model
aside there for ``COOLDOWN_SECONDS``, and the worker's other models go on serving.
A heartbeat that reports the model's engine back (the model listed again, or its
engine restarted) ends the cool-down: a restarted engine takes work once ready. Placement is what heartbeats report, never what a request
claimed. A heartbeat whose ``loaded_models`` is ``null`` ("the engine did not
answer in time") advances liveness and changes nothing recorded about models;
``[]`` means the worker holds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from opod.contract import nodeapi
from opod.fleet.inventory import NodeInventory
from opod.fleet.liveness import Availability, ModelHealth, availability, can_place, takes_model, takes_new_work


@dataclass(slots=True)
class NodeState:
    id: str
    address: str
    hostname: str = ""
    boot_id: str = ""
    token_id: str = ""
    hardware: nodeapi.Capabilities = field(default_factory=nodeapi.Capabilities)
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    """``time.monotonic()`` of the last register or heartbeat."""
    loaded_models: frozenset[str] = frozenset()
    resident_models: frozenset[str] | None = None
    sleeping: bool = False
    engine: nodeapi.EngineState | None = None
    engine_word: nodeapi.EngineStateWord | None = None
    """``engine.word``, parsed once per heartbeat (the router reads it for every request)."""
    load: nodeapi.EngineLoad | None = None
    slots: int = 0
    load_errors: dict[str, str] = field(default_factory=dict)
    load_progress: dict[str, str] = field(default_factory=dict)
    engine_urls: dict[str, str] = field(default_factory=dict)
    same_host: bool = False
    """The worker registered from this machine (loopback): its engines' loopback URLs reach them."""
    drained: bool = False
    cordoned: bool = False
    """No new replicas here; those it has keep serving (``drained`` is draining: see ``liveness.node_state``)."""
    goodbye: bool = False
    in_flight: int = 0
    """Requests this leader has relayed there and not yet finished: changed by :class:`Lease` only."""
    model_in_flight: dict[str, int] = field(default_factory=dict)
    """The same, by the model name each was sent for (an update waits for its model's to finish)."""
    model_engines: dict[str, nodeapi.EngineState] = field(default_factory=dict)
    """model → the state of the engine process serving it, as the worker last said (empty = not said)."""
    model_context: dict[str, int] = field(default_factory=dict)
    """Model → the context one request may use on its engine here, as the worker reports it."""
    replicas: dict[str, nodeapi.HeldReplica] = field(default_factory=dict)
    """model → the reconciler's replica its engine here is, as the worker last said (what a restarted leader adopts)."""
    health: dict[str, ModelHealth] = field(default_factory=dict)
    """model → the relay's record of it here: failures in a row and its cool-down."""
    inventory: NodeInventory = field(default_factory=NodeInventory)
    """Its GPUs, labels and software, for the node views and placement."""
    host_load: nodeapi.HostLoad | None = None
    """The host's CPU, memory and sensors as its latest heartbeat that said them reported; ``None`` = never said."""
    host_load_at: float = 0.0
    """Wall-clock time (``time.time()``) of that heartbeat."""

    @property
    def engine_id(self) -> str:
        return self.hardware.engine

    def base_url(self) -> str:
        return f"http://{self.address}"


LIVE_CACHE = 0.5
"""Seconds a model's live workers are remembered; liveness by heartbeat age moves in whole seconds."""
COOLDOWN_AFTER = 3
"""Consecutive failed attempts before a model is set aside on a worker."""
COOLDOWN_SECONDS = 10.0


class Lease:
    """One relayed request's hold on a worker: counted in its ``in_flight`` and its model's until :meth:`release`
    (idempotent)."""

    __slots__ = ("node", "model", "_held")

    def __init__(self, node: NodeState, model: str) -> None:
        node.in_flight += 1
        counts = node.model_in_flight
        counts[model] = counts.get(model, 0) + 1
        self.node = node
        self.model = model
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.node.in_flight -= 1
            self.node.model_in_flight[self.model] -= 1


CapacityListener = Callable[[], None]
"""Called when the slots a model's live workers offer may have changed (see :meth:`Fleet.on_capacity_change`)."""


class Fleet:
    def __init__(self) -> None:
        self._nodes: dict[str, NodeState] = {}
        self._holders: dict[str, list[NodeState]] = {}
        """model → nodes reporting it, kept in step with heartbeats so the router never scans the fleet."""
        self.changed_at = time.monotonic()
        self._version = 0
        self._live: dict[str, tuple[float, int, list[NodeState]]] = {}
        """model → (until, version, live holders): the router's answer, kept for LIVE_CACHE seconds."""
        self._capacity_listeners: list[CapacityListener] = []

    def on_capacity_change(self, listener: CapacityListener) -> None:
        """Call ``listener`` whenever a worker joins, leaves, drains, comes back, or reports other slots or models.

        A cooldown running out is not announced (nothing happens at that moment); listeners
        that must notice it look again on their own.
        """
        self._capacity_listeners.append(listener)

    def _capacity_changed(self) -> None:
        for listener in self._capacity_listeners:
            listener()

    lease = staticmethod(Lease)
    """``lease(node, model)``: count a request for ``model`` in flight on ``node`` until the returned lease is
    released (the class itself, so that taking a lease is one call on every request's way)."""

    def in_flight(self, model: str) -> int:
        """Requests for ``model`` this leader has relayed and not yet seen finish, on every worker."""
        return sum(node.model_in_flight.get(model, 0) for node in self._nodes.values())

    def touched(self) -> None:
        """Something that decides liveness changed: cached answers are stale."""
        self._version += 1

    def _reindex(self) -> None:
        holders: dict[str, list[NodeState]] = {}
        for node in sorted(self._nodes.values(), key=lambda n: n.id):
            for model in node.loaded_models:
                holders.setdefault(model, []).append(node)
        self._holders = holders
        self.changed_at = time.monotonic()
        self._version += 1

    # --- what workers tell us ---------------------------------------------

    def register(self, req: nodeapi.RegisterRequest, token_id: str, hardware: nodeapi.Capabilities) -> NodeState:
        now = time.monotonic()
        node = self._nodes.get(req.id)
        restarted = node is not None and node.boot_id != req.boot_id
        if node is None or restarted:
            drained = node.drained if node else False
            node = NodeState(id=req.id, address=req.address, drained=drained)
            self._nodes[req.id] = node
            self._reindex()
        node.address = req.address
        node.hostname = req.hostname
        node.boot_id = req.boot_id
        node.token_id = token_id
        node.hardware = hardware
        node.registered_at = node.registered_at or now
        node.last_heartbeat = now
        node.goodbye = False
        self.changed_at = now
        self._version += 1
        self._capacity_changed()
        return node

    def heartbeat(self, hb: nodeapi.Heartbeat) -> NodeState | None:
        """Apply a heartbeat; ``None`` when the node is unknown (it must register first)."""
        node = self._nodes.get(hb.id)
        if node is None:
            return None
        now = time.monotonic()
        version, slots = self._version, node.slots
        if not takes_new_work(node, now)[0]:
            self._version += 1  # it may take work again from this heartbeat on
        node.last_heartbeat = now
        if hb.boot_id and node.boot_id and hb.boot_id != node.boot_id:
            node.boot_id = hb.boot_id
        if hb.loaded_models is not None:
            models = frozenset(hb.loaded_models)
            if models != node.loaded_models:
                for back in models - node.loaded_models:
                    node.health.pop(back, None)  # its engine is reported serving again: a fresh start
                node.loaded_models = models
                self._reindex()
            node.resident_models = frozenset(hb.resident_models) if hb.resident_models is not None else None
        word = hb.engine.word if hb.engine is not None else None
        if hb.sleeping != node.sleeping or word is not node.engine_word:
            self._version += 1
        node.sleeping = hb.sleeping
        node.engine = hb.engine
        node.engine_word = word
        node.goodbye = (
            hb.engine is not None and hb.engine.word is nodeapi.EngineStateWord.STOPPED and not hb.loaded_models
        )
        if hb.load is not None:
            node.load = hb.load
        if hb.host_load is not None:
            node.host_load, node.host_load_at = hb.host_load, time.time()
        if hb.slots:
            node.slots = hb.slots
        if hb.disk_free_gb and hb.disk_free_gb != node.hardware.disk_free_gb:
            node.hardware = node.hardware.model_copy(update={"disk_free_gb": hb.disk_free_gb})
        node.load_errors = dict(hb.load_errors or {})
        node.load_progress = dict(hb.load_progress or {})
        node.engine_urls = dict(hb.engine_urls or {}) if node.same_host else {}
        node.model_context = dict(hb.model_context or {})
        if hb.loaded_models is not None:
            node.replicas = dict(hb.replicas or {})
        if hb.model_engines is not None or node.model_engines:
            self._engines_reported(node, dict(hb.model_engines or {}))
        if self._version != version or node.slots != slots:
            self._capacity_changed()
        return node

    def _engines_reported(self, node: NodeState, engines: dict[str, nodeapi.EngineState]) -> None:
        """Take the worker's word for each model's engine; an engine relaunched since is a fresh start."""
        for model, engine in engines.items():
            before = node.model_engines.get(model)
            if before is not None and engine.restarts != before.restarts and model in node.health:
                del node.health[model]
                self._version += 1
        node.model_engines = engines

    def set_drained(self, node_id: str, drained: bool) -> NodeState | None:
        node = self._nodes.get(node_id)
        if node is not None:
            node.drained = drained
            self.changed_at = time.monotonic()
            self._version += 1
            self._capacity_changed()
        return node

    def set_state(self, node_id: str, *, drained: bool, cordoned: bool) -> NodeState | None:
        """The operator's state of a node (``liveness.state_flags``): draining, cordoned, or ready."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.cordoned = cordoned
            self.set_drained(node_id, drained)
        return node

    def remove(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._reindex()
        self._capacity_changed()

    def restore(self, node: NodeState) -> None:
        """Put back a node known from the store: reachable by heartbeat, not live until one arrives."""
        node.last_heartbeat = 0.0
        self._nodes.setdefault(node.id, node)
        self._reindex()

    # --- what the router and listings ask ----------------------------------

    def get(self, node_id: str) -> NodeState | None:
        return self._nodes.get(node_id)

    def __iter__(self) -> Iterator[NodeState]:
        return iter(sorted(self._nodes.values(), key=lambda n: n.id))

    def __len__(self) -> int:
        return len(self._nodes)

    def live(self, now: float | None = None) -> list[NodeState]:
        now = time.monotonic() if now is None else now
        return [n for n in self if takes_new_work(n, now)[0]]

    def placeable(self, now: float | None = None) -> list[NodeState]:
        """Workers a model may be loaded on now (reachable, not drained)."""
        now = time.monotonic() if now is None else now
        return [n for n in self if can_place(n, now)[0]]

    def workers_for(self, model: str, now: float | None = None) -> list[NodeState]:
        """Live workers whose engine reports ``model`` loaded, in node id order.

        Kept for up to ``LIVE_CACHE`` seconds, or until something that decides liveness
        changes (a registration, a drain, a failure, an engine changing state): the
        router asks this for every request.
        """
        now = time.monotonic() if now is None else now
        cached = self._live.get(model)
        if cached is not None and cached[0] > now and cached[1] == self._version:
            return cached[2]
        live = [n for n in self._holders.get(model, ()) if takes_model(n, model, now)]
        self._live[model] = (now + LIVE_CACHE, self._version, live)
        return live

    def serves(self, model: str, now: float | None = None) -> bool:
        """Whether some live worker serves ``model`` now (the gateway asks for every request: the cached answer)."""
        return bool(self.workers_for(model, now))

    def served_models(self, now: float | None = None) -> set[str]:
        """Models some live worker serves now (a model cooling down everywhere is not among them)."""
        now = time.monotonic() if now is None else now
        return {model for model, holders in self._holders.items() if any(takes_model(n, model, now) for n in holders)}

    def served_context(self, model: str, now: float | None = None) -> int | None:
        """The context one request for ``model`` may use wherever it is routed: the smallest its live workers report."""
        reported = [c for n in self.workers_for(model, now) if (c := n.model_context.get(model))]
        return min(reported) if reported else None

    def availability(self, model: str, now: float | None = None) -> Availability:
        """Whether ``model`` can be served now, and if not why, per worker (:func:`opod.fleet.liveness.availability`)."""
        return availability(model, self, time.monotonic() if now is None else now)

    def holders(self, model: str) -> Iterable[NodeState]:
        """Every known worker reporting ``model``, live or not."""
        return list(self._holders.get(model, ()))

    # --- outcomes of requests ----------------------------------------------

    def succeeded(self, node: NodeState, model: str) -> None:
        """An attempt at ``model`` on ``node`` was answered: its run of failures ends."""
        health = node.health.get(model)
        if health is not None and health.failures:
            health.failures = 0

    def failed(self, node: NodeState, model: str, problem: str = "") -> None:
        """An attempt at ``model`` on ``node`` failed for a reason of the worker's (never the request's content).

        The ``COOLDOWN_AFTER``-th in a row sets that model aside there for ``COOLDOWN_SECONDS``;
        the worker's other models are not touched.
        """
        health = node.health.setdefault(model, ModelHealth())
        health.failures += 1
        health.last_problem = problem[:200]
        if health.failures >= COOLDOWN_AFTER:
            health.cooldown_until = time.monotonic() + COOLDOWN_SECONDS
            health.cooled_after, health.failures = health.failures, 0
            self._version += 1
            self._capacity_changed()
