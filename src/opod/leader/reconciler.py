"""Bringing the fleet to what is wanted: replicas of each defined model, placed, started, moved and stopped.

Runs every few seconds and whenever the fleet, a definition or demand changes.
A model with a definition (``KnownModel.definition``, from the management API's
catalog) gets the replicas its scaling asks for now (:mod:`opod.leader.replicas`),
each where :func:`opod.fleet.placement.place` puts it; a placement that preempts
lower-class replicas stops them first. Failed starts back off (1 s, doubling) and
after ``PARK_AFTER`` in a row the model is parked until its definition changes
or it is retried. A replica on a draining node, or one an operator restarts, is
replaced: the new one starts elsewhere first and the old one stops once the new
one is ready. A draining node takes no new request at once, so a request that
finds a model's only replicas there waits for the replacement (:meth:`Reconciler.requested`),
as one waits for a replica starting.

What is pinned to a node (``KnownModel.wanted``, the ``load``/``unload`` pins), and
every model without a definition, is loaded and unloaded by :mod:`opod.leader.pinned`,
which a round calls first.

Each replica a worker reports (``NodeState.replicas``: the id, profile, digest and
devices its load named) that this leader does not track is adopted at the start
of a round (:mod:`opod.leader.adoption`): after a leader restart the
replicas carry on under their ids and keep their GPUs. For a short while after
start no new replica is placed while nodes known from the store have not
reported yet, so what they run is adopted rather than started twice.

Capacity quotas (:mod:`opod.fleet.quotas`) are read every round: each model counts
against its owner's scope and every scope above it, and a replica the quotas
refuse is not placed (``explain-placement`` says which quota); the first refusal
for a model, and each time the refusing scope changes, is emitted as ``quota.hit``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

from opod.catalog.definition import fingerprint
from opod.fleet.followers import EventSink
from opod.fleet.liveness import HEARTBEAT_MAX_AGE
from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry
from opod.fleet.placed import CLASSES, Held, Rejection
from opod.fleet.placement import Planner
from opod.fleet.quotas import Amount, QuotaTable
from opod.fleet.scopes import ScopeTree
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient
from opod.leader import adoption, model_status
from opod.leader.pinned import PENDING_FOR, PinnedLoads
from opod.leader.quota_hits import QuotaHits
from opod.leader.replica_calls import load_replica, unload_replica
from opod.leader.replicas import (
    ACTIVE,
    DRAINING,
    FAILED,
    READY,
    STARTING,
    Parking,
    Replica,
    capacity_class,
    desired_count,
    idle_timeout,
)

log = logging.getLogger("opod.leader")

PARK_AFTER = 3
"""Failed starts in a row before a model is parked."""
START_BACKOFF_MAX = 60.0
FAILED_KEPT = 60.0
"""Seconds a failed replica stays listed (``GET /replicas``) after it is cleaned off its nodes."""
DEMAND_WAIT = 300.0
"""How long a request for an on-demand model with nothing serving waits for the replica it started."""
STOPPED_KEPT = 600.0
"""Seconds a replica this leader stopped is remembered, so a heartbeat sent before its engine ended does not bring it back."""


def draining(node: NodeState) -> bool:
    """A node whose replicas are moved off (the drain state)."""
    return node.drained


class Reconciler:
    def __init__(
        self,
        fleet: Fleet,
        models: ModelRegistry,
        workers: WorkerClient,
        housekeeping: Callable[[], object] | None = None,
        *,
        clock: Callable[[], datetime] = datetime.now,
        quotas: QuotaTable | None = None,
        scopes: ScopeTree | None = None,
        emit: EventSink | None = None,
    ) -> None:
        self.fleet = fleet
        self.models = models
        self.workers = workers
        self.housekeeping = housekeeping
        """Called once per round (sweeping the prefix index by age)."""
        self.clock = clock
        """Local wall time: what schedule windows are read in."""
        self.pinned = PinnedLoads(fleet, workers)
        self.replicas: dict[str, Replica] = {}
        self._by_model: dict[str, dict[str, Replica]] = {}
        """model → its replicas by id: the same replicas as ``replicas``, so a round does not scan them all per model."""
        self.parking: dict[str, Parking] = {}
        self.demand: dict[str, float] = {}
        """model → ``time.monotonic()`` of the last request that asked for it."""
        self.last_rejections: dict[str, list[Rejection]] = {}
        """model → why each node was refused at its last placement (``explain-placement``)."""
        self._limits: dict[str, tuple[int, int]] = {}
        """model → (max_surge, max_unavailable) of its last queued restart."""
        self.rounds = 0
        self.born = time.monotonic()
        self._awaiting = False
        """Nodes known from the store have not reported yet: no new replicas while they may bring theirs."""
        self._stopped: dict[str, float] = {}
        """Replica id → ``time.monotonic()`` when this leader stopped it: never adopted again."""
        self._planner = Planner([], [])
        """The current pass's view of free devices (see ``_plan_replicas``)."""
        self._wake = asyncio.Event()
        self.quotas = quotas if quotas is not None else QuotaTable()
        self.scopes = scopes
        """Owners' scopes and those above them; without it an owner counts against exactly the scope it names."""
        self.quota_hits = QuotaHits(emit)

    def _of(self, model_id: str) -> list[Replica]:
        return list(self._by_model.get(model_id, {}).values())

    def _drop(self, replica: Replica) -> None:
        """Forget a replica: the one way out of ``replicas`` and its index by model."""
        self.replicas.pop(replica.id, None)
        self._by_model.get(replica.model, {}).pop(replica.id, None)

    def kick(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event, every: float = 3.0) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.reconcile()
                if self.housekeeping is not None:
                    self.housekeeping()
            except Exception:  # one bad round must not stop the loop
                log.exception("reconcile round failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=every)
            except TimeoutError:
                pass

    # --- what listings and the gateway ask ------------------------------------------

    def status(self, model_id: str) -> str:
        """A short phrase for listings, in the words a client's 503 uses (:func:`opod.leader.model_status.status`)."""
        model = self.models.get(model_id)
        return model_status.status(
            model_id, model, self.fleet, self.pinned, self.parking.get(model_id), self._of(model_id)
        )

    def requested(self, model_id: str) -> Awaitable[None] | None:
        """The gateway's call for each request: counts the model as asked for; when nothing serves a defined
        model, starts a replica and answers something to await until it serves (``None``: go on now)."""
        known = self.models.get(model_id)
        if known is None or known.definition is None:
            return None
        now = time.monotonic()
        self.demand[model_id] = now
        if self.fleet.workers_for(model_id, now):
            return None  # a live worker serves it
        parking = self.parking.get(model_id)
        if parking is not None and parking.parked:
            return None
        active = [r for r in self._of(model_id) if r.state in ACTIVE]
        if active and not any(r.state == STARTING or self._moved_off(r) for r in active):
            return None  # placed, and down for another reason (its engine restarting): the 503 says why at once
        self.kick()
        return self._wait_served(model_id, now)

    def _moved_off(self, replica: Replica) -> bool:
        """The replica sits on a draining node: the next round starts its replacement elsewhere."""
        return any((n := self.fleet.get(node_id)) is not None and draining(n) for node_id in replica.nodes)

    async def _wait_served(self, model_id: str, since: float) -> None:
        rounds = self.rounds
        while time.monotonic() - since < DEMAND_WAIT:
            if self.fleet.serves(model_id):
                return
            self.demand[model_id] = time.monotonic()  # a request still waiting is demand: its replica must not idle out
            parking = self.parking.get(model_id)
            if parking is not None and parking.parked:
                return
            if (
                self.rounds > rounds + 1
                and not self._awaiting
                and not any(r.model == model_id and r.state == STARTING for r in self.replicas.values())
            ):
                return  # a round came and went without starting one: it cannot be placed, the 503 says so
            await asyncio.sleep(0.1)

    # --- a round -----------------------------------------------------------------------

    async def reconcile(self) -> None:
        now = time.monotonic()
        live = self.fleet.placeable(now)
        jobs = []
        for model in self.models:
            for node_key, wanted in model.wanted.items():
                if model.definition is not None and (node_key == ANY_NODE or model.removed):
                    continue  # a defined model's replicas are the rounds' below; only what is pinned to a node is kept here
                if (
                    model.definition is not None
                    and wanted != "loaded"
                    and any(
                        node_key in r.nodes for r in self.replicas.values() if r.model == model.id and r.state in ACTIVE
                    )
                ):
                    continue  # a replica there is moved off below, not unloaded under its feet
                if wanted == "loaded":
                    jobs += self.pinned.loads(model, node_key, live, now)
                else:
                    jobs += self.pinned.unloads(model, node_key, live)
        stops, starts = self._plan_replicas(now)
        if stops:
            await asyncio.gather(*stops)
        if jobs or starts:
            await asyncio.gather(*jobs, *starts)
        for model in self.models:
            parking = self.parking.get(model.id)
            if model.definition is not None and parking is not None:  # a start refused just now shows at once
                model.status.failures, model.status.parked, model.status.reason = (
                    parking.failures,
                    parking.parked,
                    parking.reason,
                )
        for model in list(self.models):
            if (
                model.removed
                and not any(model.id in n.loaded_models for n in self.fleet)
                and not any(r.model == model.id and r.state in ACTIVE for r in self.replicas.values())
            ):
                self.models.remove(model.id)
                self.parking.pop(model.id, None)
                self.demand.pop(model.id, None)
        self.rounds += 1

    # --- replicas of defined models --------------------------------------------------

    def _plan_replicas(self, now: float) -> tuple[list[Awaitable[None]], list[Awaitable[None]]]:
        stops: list[Awaitable[None]] = []
        starts: list[Awaitable[None]] = []
        for replica in list(self.replicas.values()):
            self._observe(replica, now)
            if replica.state == FAILED:
                if not replica.unloaded:
                    replica.unloaded = True
                    stops.append(self._unload_replica(replica, forget=False))
                elif now - replica.started > FAILED_KEPT and now - replica.ready_at > FAILED_KEPT:
                    self._drop(replica)
        self._adopt(now)
        self._awaiting = now - self.born <= HEARTBEAT_MAX_AGE and adoption.awaiting_reports(self.fleet)
        # One planner for the whole pass: built once from what replicas hold, told of each start and preemption.
        held = [
            Held(
                replica_id=r.id,
                model=r.model,
                profile=r.profile,
                klass=r.klass,
                gpus={k: list(v) for k, v in r.gpus.items()},
                cpu_cores=r.cpu_cores,
                memory_gb=r.memory_gb,
            )
            for r in self.replicas.values()
            if r.state in ACTIVE
        ]
        defined = [m for m in self.models if m.definition is not None]
        owners = {m.id: m.definition.owner or "" for m in defined if m.definition is not None}
        self._planner = Planner(list(self.fleet), held, now=now, quotas=self.quotas.book(owners, self.scopes))
        order = {c: i for i, c in enumerate(CLASSES)}
        defined.sort(key=lambda m: (order.get(capacity_class(m.definition), 1) if m.definition else 1, m.id))
        at = self.clock()
        for model in defined:
            self._plan_model(model, now, at, stops, starts)
        return stops, starts

    def _adopt(self, now: float) -> None:
        """Track, under their own ids, the replicas workers report running and this leader does not know."""
        for replica_id in [k for k, at in self._stopped.items() if now - at > STOPPED_KEPT]:
            del self._stopped[replica_id]
        for replica in adoption.reported(
            self.fleet,
            self.models,
            self.replicas,
            self._stopped,
            now=now,
            starting=now - self.born <= HEARTBEAT_MAX_AGE,
        ):
            self.replicas[replica.id] = replica
            self._by_model.setdefault(replica.model, {})[replica.id] = replica
            log.info(
                "adopted replica %s of %s on %s (GPUs %s)",
                replica.id,
                replica.model,
                "+".join(replica.nodes),
                ", ".join(f"{n}: {g}" for n, g in replica.gpus.items()),
            )

    def _observe(self, replica: Replica, now: float) -> None:
        """Move a replica on by what rank 0's heartbeats say."""
        if replica.state not in (STARTING, READY):
            return
        head = self.fleet.get(replica.nodes[0])
        if head is None or now - head.last_heartbeat > HEARTBEAT_MAX_AGE or head.goodbye:
            self._fail(replica, f"node {replica.nodes[0]} stopped answering", now)
            return
        fresh = head.last_heartbeat > replica.started + 0.5  # a heartbeat sent after the load was
        if replica.state == STARTING:
            if replica.model in head.loaded_models:
                replica.state, replica.ready_at, replica.ever_ready = READY, now, True
                parking = self.parking.get(replica.model)
                if parking is not None and not parking.parked:
                    parking.failures, parking.reason = 0, ""
                log.info("replica %s of %s ready on %s", replica.id, replica.model, "+".join(replica.nodes))
            elif fresh and replica.model in head.load_errors:
                self._fail(replica, head.load_errors[replica.model], now)
            elif now - replica.started > self._startup_timeout(replica):
                self._fail(replica, f"not ready after {self._startup_timeout(replica):.0f}s", now)
            return
        engine = head.model_engines.get(replica.model)
        if replica.model in head.loaded_models or head.last_heartbeat <= replica.ready_at:
            return
        if replica.model in head.load_errors:
            self._fail(replica, head.load_errors[replica.model], now)
        elif engine is None or engine.state in ("crash-looping", "stopped"):
            self._fail(
                replica,
                f"its engine on {head.id} stopped" + (f" ({engine.detail})" if engine and engine.detail else ""),
                now,
            )

    def _startup_timeout(self, replica: Replica) -> float:
        model = self.models.get(replica.model)
        profiles = (model.definition.profiles or []) if model is not None and model.definition is not None else []
        ns = profiles[replica.profile].startup_timeout if replica.profile < len(profiles) else None
        return ns / 1e9 if ns else PENDING_FOR

    def _fail(self, replica: Replica, why: str, now: float) -> None:
        was_ready = replica.ever_ready
        replica.state, replica.error = FAILED, why[:300]
        log.warning("replica %s of %s failed: %s", replica.id, replica.model, why)
        old = self.replicas.get(replica.replaces)
        if old is not None and old.replaced_by == replica.id:
            old.replaced_by = ""
            if old.restart == "replacing":
                old.restart = "queued"
        if was_ready:
            return
        parking = self.parking.setdefault(replica.model, Parking())
        parking.failures += 1
        parking.reason = why[:300]
        parking.next_try = now + min(2 ** (parking.failures - 1), START_BACKOFF_MAX)
        if parking.failures >= PARK_AFTER:
            parking.parked = True
            log.warning("%s parked after %d failed starts: %s", replica.model, parking.failures, why)

    def _plan_model(
        self, model: KnownModel, now: float, at: datetime, stops: list[Awaitable[None]], starts: list[Awaitable[None]]
    ) -> None:
        definition = model.definition
        assert definition is not None
        digest = fingerprint(definition)
        parking = self.parking.setdefault(model.id, Parking(fingerprint=digest))
        if parking.fingerprint != digest:
            parking.failures, parking.reason, parking.parked, parking.next_try = 0, "", False, 0.0
            parking.fingerprint = digest
        mine = [r for r in self._of(model.id) if r.state in ACTIVE]
        last = self.demand.get(model.id)
        demanded = last is not None and now - last < idle_timeout(definition)
        wanted = 0 if model.removed else desired_count(definition, at, demanded)
        pins = {n for n, w in model.wanted.items() if n != ANY_NODE and w == "loaded"}
        banned = {n for n, w in model.wanted.items() if n != ANY_NODE and w == "unloaded"}
        if not model.removed and not pins and model.wanted.get(ANY_NODE) == "loaded":
            wanted = max(wanted, 1)  # ``load`` anywhere: at least one replica
        # A node the model is pinned to and served on counts as one of its replicas.
        on_replicas = {n for r in mine for n in r.nodes}
        pinned_serving = sum(
            1 for n in pins - on_replicas if (node := self.fleet.get(n)) is not None and model.id in node.loaded_models
        )
        wanted = max(wanted - pinned_serving, 0)
        klass = capacity_class(definition)
        status = model.status
        status.unplaceable = False
        # Replacements that are ready: the replica they take over from stops now.
        for replica in mine:
            new = self.replicas.get(replica.replaced_by)
            if replica.state != DRAINING and new is not None and new.state == READY:
                stops.append(self._stop(replica))
        serving = [r for r in mine if r.state in (STARTING, READY) and not r.replaced_by]
        budget = self._restart_budget(mine)
        for replica in list(serving):
            nodes = [self.fleet.get(n) for n in replica.nodes]
            if banned & set(replica.nodes) and (
                pinned_serving or any(r.state == READY for r in serving if r is not replica)
            ):
                serving.remove(replica)  # unloaded there by the operator, and served elsewhere: stop it now
                stops.append(self._stop(replica))
                continue
            moving = any(n is not None and draining(n) for n in nodes) or bool(banned & set(replica.nodes))
            if replica.restart == "queued" and replica.in_place and budget["unavailable"] > 0:
                budget["unavailable"] -= 1
                serving.remove(replica)
                stops.append(self._stop(replica))
            elif (
                (moving or replica.restart == "queued")
                and (moving or budget["surge"] > 0)
                and not parking.parked
                and not self._awaiting
            ):
                new = self._start_one(model, klass, now, stops, starts, replaces=replica)
                if new is not None:
                    budget["surge"] -= 0 if moving else 1
                    serving.remove(replica)
                    serving.append(new)
                elif replica.restart == "queued":
                    replica.restart_waits = self._no_room_beside(model.id)
        while len(serving) < wanted and not parking.parked and now >= parking.next_try and not self._awaiting:
            new = self._start_one(model, klass, now, stops, starts)
            if new is None:
                status.unplaceable = True
                break
            serving.append(new)
        extra = len(serving) - wanted
        if extra > 0:
            victims = sorted(serving, key=lambda r: (r.state == READY, r.started), reverse=False)[:extra]
            for replica in victims:
                stops.append(self._stop(replica))
        kept = [r for r in self._of(model.id) if r.state in ACTIVE]
        status.desired = wanted
        status.ready = sum(1 for r in kept if r.state == READY)
        status.total = len(kept)
        status.failures, status.parked, status.reason = parking.failures, parking.parked, parking.reason
        if status.held_for and status.ready >= wanted:
            status.held_for = ""

    def _restart_budget(self, mine: list[Replica]) -> dict[str, int]:
        """How many more of a model's replicas may be replaced beside themselves, or stopped first, this round."""
        surge, unavailable = self._limits.get(mine[0].model, (1, 0)) if mine else (1, 0)
        replacing = sum(1 for r in mine if r.restart == "replacing")
        down = sum(1 for r in mine if r.state == DRAINING and r.restart)
        return {"surge": max(surge - replacing, 0), "unavailable": max(unavailable - down, 0)}

    def _start_one(
        self,
        model: KnownModel,
        klass: str,
        now: float,
        stops: list[Awaitable[None]],
        starts: list[Awaitable[None]],
        replaces: Replica | None = None,
    ) -> Replica | None:
        """Place one more replica of ``model`` and schedule its start (and any preemption); ``None`` when it fits nowhere."""
        definition = model.definition
        assert definition is not None
        taken = {n: "holds a replica of it already" for r in self._of(model.id) if r.state in ACTIVE for n in r.nodes}
        for node in self.fleet.holders(model.id):
            if model.wanted.get(node.id) == "loaded":
                taken.setdefault(node.id, "serves it already (loaded there by the operator)")
        for node_id, word in model.wanted.items():
            if node_id != ANY_NODE and word == "unloaded":
                taken.setdefault(node_id, "unloaded there by the operator")
        assignment, rejections = self._planner.place(
            model.id, definition, klass=klass, engine=model.engine, exclude=taken
        )
        self.last_rejections[model.id] = list(rejections)
        if assignment is None:
            self.quota_hits.unplaced(model.id, rejections, self._planner.quotas)
            return None
        self.quota_hits.placed(model.id)
        for victim_id in assignment.preempts:
            victim = self.replicas.get(victim_id)
            if victim is None or victim.state not in ACTIVE:
                continue
            self._planner.release(victim_id)
            stops.append(self._stop(victim))
            owner = self.models.get(victim.model)
            if owner is not None:
                owner.status.preempted += 1
                owner.status.held_for = model.id
            log.info("replica %s of %s preempted for %s", victim.id, victim.model, model.id)
        profiles = definition.profiles or []
        profile = profiles[assignment.profile] if assignment.profile < len(profiles) else None
        replica = Replica(
            id=f"{model.id}-{secrets.token_hex(3)}",
            model=model.id,
            profile=assignment.profile,
            profile_name=(profile.name if profile is not None and profile.name else str(assignment.profile)),
            klass=klass,
            nodes=list(assignment.nodes),
            gpus={k: list(v) for k, v in assignment.gpus.items()},
            fingerprint=fingerprint(definition),
            started=now,
            cpu_cores=assignment.cpu_cores,
            memory_gb=assignment.memory_gb,
        )
        if replaces is not None:
            replica.replaces, replaces.replaced_by = replaces.id, replica.id
            replaces.restart_waits = ""
            if replaces.restart == "queued":
                replaces.restart = "replacing"
        self.replicas[replica.id] = replica
        self._by_model.setdefault(replica.model, {})[replica.id] = replica
        self._planner.take(assignment, replica.id, klass)
        starts.append(self._start(model, replica))
        return replica

    def _no_room_beside(self, model_id: str) -> str:
        """Why a queued restart cannot start a replica's replacement beside it, from the last placement's refusals."""
        refusals = "; ".join(f"{r.node}: {r.reason}" for r in self.last_rejections.get(model_id, [])[:4])
        return (
            f"restart waits: no node can take its replacement beside it ({refusals or 'no node to place on'}); "
            "free a device of its class, or restart it in place (--in-place --max-unavailable 1)"
        )[:400]

    def quota_holds(self) -> Mapping[str, Amount]:
        """What each scope's models hold, as the last round counted it (``QuotaView.holds``)."""
        book = self._planner.quotas
        return dict(book.holds) if book is not None else {}

    # --- calls to workers ------------------------------------------------------------

    async def _start(self, model: KnownModel, replica: Replica) -> None:
        why = await load_replica(self.fleet, self.workers, model, replica)
        if why:
            self._fail(replica, why, time.monotonic())

    def _stop(self, replica: Replica) -> Awaitable[None]:
        """Mark the replica draining now (this round's decisions see it go) and answer the call that stops it."""
        replica.state = DRAINING
        return self._unload_replica(replica, forget=True)

    async def _unload_replica(self, replica: Replica, *, forget: bool) -> None:
        self._stopped[replica.id] = time.monotonic()
        await unload_replica(self.fleet, self.workers, self.models, replica)
        if forget:
            self._drop(replica)

    # --- operators' requests -----------------------------------------------------------

    def replica_list(self) -> list[Replica]:
        return sorted(self.replicas.values(), key=lambda r: (r.model, r.started, r.id))

    def last_request(self, model: str) -> float | None:
        return self.demand.get(model)

    def parked(self) -> list[tuple[str, int, str]]:
        return [
            (m, p.failures, p.reason)
            for m, p in sorted(self.parking.items())
            if p.parked and self.models.active(m) is not None
        ]

    def retry(self, model_id: str) -> bool:
        """Clear a model's parking and run of failures; whether it had been parked."""
        parking = self.parking.get(model_id)
        was = parking is not None and parking.parked
        if parking is not None:
            parking.failures, parking.reason, parking.parked, parking.next_try = 0, "", False, 0.0
        model = self.models.get(model_id)
        if model is not None:
            model.status.parked, model.status.failures, model.status.reason = False, 0, ""
        self.kick()
        return was

    def queue_restart(
        self, replica_ids: list[str], *, in_place: bool, max_surge: int, max_unavailable: int
    ) -> list[str]:
        """Mark replicas for a rolling restart; the rounds replace them within the limits, per model."""
        queued = []
        for replica_id in replica_ids:
            replica = self.replicas.get(replica_id)
            if replica is None or replica.state not in (STARTING, READY) or replica.replaced_by:
                continue
            replica.restart, replica.in_place, replica.restart_waits = "queued", in_place, ""
            surge, unavailable = (max_surge, max_unavailable) if (max_surge or max_unavailable) else (1, 0)
            if in_place and not unavailable:
                unavailable = 1
            self._limits[replica.model] = (surge, unavailable)
            queued.append(replica_id)
        self.kick()
        return queued
