"""The reconciler's replica rules, in process: real fleet, real placement, a recording stand-in for the workers' HTTP.

Each test drives rounds by hand and plays the workers' heartbeats, so every rule
(preemption, drain, on demand, schedule, parking, ranks across nodes) is checked
in milliseconds; tests/e2e/test_placement.py runs the same through real processes.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import pytest

from opod.contract import nodeapi
from opod.contract.admin.catalog import CatalogModel, CatalogProfile, CatalogScaleWindow, CatalogScaling
from opod.fleet.inventory import GPUDevice, NodeInventory
from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.leader.reconciler import PARK_AFTER, Reconciler


class Workers:
    """Records load and unload calls; ``refuse`` makes loads of a model answer 500."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.refuse: set[str] = set()

    async def call_json(self, node, method, path, body, timeout=30):
        self.calls.append((node.id, path, body))
        if path == nodeapi.PATH_MODEL_LOAD and body["id"] in self.refuse:
            return 500, "engine would not start"
        return 200, {"status": "ready", "model": body["id"]}

    def loads(self, model: str | None = None) -> list[tuple[str, dict]]:
        return [
            (n, b) for n, p, b in self.calls if p == nodeapi.PATH_MODEL_LOAD and (model is None or b["id"] == model)
        ]

    def unloads(self, model: str | None = None) -> list[str]:
        return [n for n, p, b in self.calls if p == nodeapi.PATH_MODEL_UNLOAD and (model is None or b["id"] == model)]


def node(fleet: Fleet, node_id: str, gpus: int = 0, gpu_class: str = "A10G") -> NodeState:
    state = NodeState(id=node_id, address=f"10.0.0.{len(fleet) + 1}:8081", hardware=nodeapi.Capabilities(engine="sim"))
    state.inventory = NodeInventory(
        gpus=[
            GPUDevice(
                index=i, label=str(i), name=gpu_class, gpu_class=gpu_class, memory_mb=24000, compute_capability="8.6"
            )
            for i in range(gpus)
        ],
        declared=True,
    )
    fleet.restore(state)
    state.last_heartbeat = time.monotonic()
    return state


def heartbeat(fleet: Fleet, reconciler: Reconciler) -> None:
    """Every worker reports what the reconciler asked of it: its replicas' models loaded on rank 0."""
    loaded: dict[str, set[str]] = {n.id: set() for n in fleet}
    for replica in reconciler.replicas.values():
        if replica.state in ("starting", "ready", "draining"):
            loaded[replica.nodes[0]].add(replica.model)
    time.sleep(0.51)  # a heartbeat after the load (the reconciler trusts only those)
    for node_id, models in loaded.items():
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, loaded_models=sorted(models)))


def model(registry: ModelRegistry, name: str, **definition) -> KnownModel:
    known = KnownModel(id=name, engine="sim", definition=CatalogModel(name=name, **definition))
    registry.put(known)
    return known


def gpu_profile(gpu_class: str = "A10G", **extra) -> list[CatalogProfile]:
    return [CatalogProfile(name="gpu", gpu_class=gpu_class, **extra)]


@pytest.fixture
def world():
    fleet, registry, workers = Fleet(), ModelRegistry(), Workers()
    return fleet, registry, workers, Reconciler(fleet, registry, workers)  # type: ignore[arg-type]


def run(reconciler: Reconciler) -> None:
    asyncio.run(reconciler.reconcile())


def test_a_model_gets_its_min_replicas_with_devices_and_ready_after_a_heartbeat(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1", gpus=2)
    model(registry, "chat", profiles=gpu_profile(tp=2, env={"A": "b"}, args=["--x"]))
    run(rec)
    ((node_id, body),) = workers.loads("chat")
    assert (
        node_id == "n1"
        and body["devices"] == [0, 1]
        and body["tp"] == 2
        and body["env"] == {"A": "b"}
        and body["args"] == ["--x"]
    )
    assert body["replica"] in rec.replicas
    heartbeat(fleet, rec)
    run(rec)
    (replica,) = rec.replicas.values()
    assert replica.state == "ready"
    assert registry.get("chat").status.ready == 1 and registry.get("chat").status.desired == 1


def test_a_critical_model_preempts_an_opportunistic_one(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1", gpus=1)
    model(registry, "spare", profiles=gpu_profile(), **{"class": "opportunistic"})
    run(rec)
    heartbeat(fleet, rec)
    run(rec)
    model(registry, "vital", profiles=gpu_profile(), **{"class": "critical"})
    run(rec)
    assert workers.unloads("spare") == ["n1"]
    assert [n for n, _ in workers.loads("vital")] == ["n1"]
    spare = registry.get("spare").status
    assert spare.preempted == 1 and spare.held_for == "vital" and spare.unplaceable
    assert not any(r.model == "spare" for r in rec.replicas.values())


def test_a_draining_node_s_replica_is_replaced_elsewhere_before_it_stops(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1", gpus=1)
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    heartbeat(fleet, rec)
    run(rec)
    node(fleet, "n2", gpus=1)
    fleet.set_drained("n1", True)
    run(rec)
    assert [n for n, _ in workers.loads("chat")] == ["n1", "n2"]
    assert workers.unloads("chat") == []  # the old one serves until the new one is ready
    heartbeat(fleet, rec)
    run(rec)
    assert workers.unloads("chat") == ["n1"]
    (replica,) = [r for r in rec.replicas.values() if r.state == "ready"]
    assert replica.nodes == ["n2"]


def test_a_request_that_comes_as_a_node_drains_waits_for_the_replacement_instead_of_a_503(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1", gpus=1)
    node(fleet, "n2", gpus=1)
    model(registry, "chat", profiles=gpu_profile(), scaling=CatalogScaling(min=1, max=1))
    run(rec)
    heartbeat(fleet, rec)
    run(rec)
    (held,) = {r.nodes[0] for r in rec.replicas.values()}
    fleet.set_drained(held, True)  # no round has run since: no replacement is starting yet

    async def request_then_round():
        waiting = rec.requested("chat")
        assert waiting is not None, "the model's one replica is being moved: the request waits for its replacement"
        task = asyncio.ensure_future(waiting)
        await rec.reconcile()
        heartbeat(fleet, rec)
        await asyncio.wait_for(task, 5)

    asyncio.run(request_then_round())
    assert fleet.serves("chat")


def test_a_cordoned_node_gets_no_new_replica_and_keeps_its_own(world):
    fleet, registry, workers, rec = world
    n1 = node(fleet, "n1", gpus=2)
    model(registry, "a", profiles=gpu_profile())
    run(rec)
    heartbeat(fleet, rec)
    n1.cordoned = True
    model(registry, "b", profiles=gpu_profile())
    run(rec)
    assert workers.loads("b") == [] and workers.unloads("a") == []
    assert registry.get("b").status.unplaceable


def test_an_on_demand_model_starts_on_a_request_and_stops_after_its_idle_timeout(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    model(registry, "lazy", scaling=CatalogScaling(min=0, max=1, idle_timeout=1_000_000_000))
    run(rec)
    assert workers.loads("lazy") == []

    async def request_then_round():
        waiting = rec.requested("lazy")
        assert waiting is not None
        task = asyncio.ensure_future(waiting)
        await rec.reconcile()
        heartbeat(fleet, rec)
        await asyncio.wait_for(task, 5)

    asyncio.run(request_then_round())
    assert [n for n, _ in workers.loads("lazy")] == ["n1"]
    assert rec.requested("lazy") is None  # served now: requests go straight on
    run(rec)
    assert workers.unloads("lazy") == []
    time.sleep(1.1)
    run(rec)
    assert workers.unloads("lazy") == ["n1"]


def test_an_on_demand_replica_slower_to_start_than_its_idle_timeout_is_kept_for_the_request_waiting(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    model(registry, "lazy", scaling=CatalogScaling(min=0, max=1, idle_timeout=500_000_000))

    async def slow_start():
        task = asyncio.ensure_future(rec.requested("lazy"))
        await rec.reconcile()
        await asyncio.sleep(0.8)  # the engine is still starting after the idle timeout has passed
        await rec.reconcile()
        assert workers.unloads("lazy") == []
        heartbeat(fleet, rec)
        await asyncio.wait_for(task, 5)

    asyncio.run(slow_start())
    assert [n for n, _ in workers.loads("lazy")] == ["n1"] and workers.unloads("lazy") == []


def test_a_schedule_window_and_its_prewarm_set_the_count(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    now = datetime(2025, 6, 2, 8, 50)  # a Monday
    rec.clock = lambda: now
    window = CatalogScaleWindow(days=["weekdays"], from_="09:00", to="17:00", min=1)
    model(registry, "office", scaling=CatalogScaling(min=0, max=1, schedule=[window], prewarm=15 * 60 * 1_000_000_000))
    run(rec)
    assert [n for n, _ in workers.loads("office")] == ["n1"]  # 10 minutes before the window: prewarmed
    heartbeat(fleet, rec)
    now = datetime(2025, 6, 7, 10, 0)  # Saturday: outside every window
    run(rec)
    assert workers.unloads("office") == ["n1"]


def test_repeated_start_failures_park_the_model_until_it_is_retried(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    broken = model(registry, "broken")
    workers.refuse.add("broken")
    for _ in range(PARK_AFTER):
        rec.parking.get("broken") and setattr(rec.parking["broken"], "next_try", 0.0)
        run(rec)
        run(rec)
    assert broken.status.parked and broken.status.failures == PARK_AFTER
    assert "engine would not start" in broken.status.reason
    tries = len(workers.loads("broken"))
    run(rec)
    assert len(workers.loads("broken")) == tries  # parked: not tried again
    assert rec.parked() == [("broken", PARK_AFTER, broken.status.reason)]
    workers.refuse.clear()
    assert rec.retry("broken") is True
    run(rec)
    assert len(workers.loads("broken")) == tries + 1 and not broken.status.parked


def test_a_changed_definition_unparks(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    broken = model(registry, "broken")
    workers.refuse.add("broken")
    for _ in range(PARK_AFTER):
        rec.parking.get("broken") and setattr(rec.parking["broken"], "next_try", 0.0)
        run(rec)
    assert broken.status.parked
    workers.refuse.clear()
    broken.definition = CatalogModel(name="broken", description="fixed")
    run(rec)
    assert not broken.status.parked and workers.loads("broken")[-1][0] == "n1"


def test_a_replica_across_two_nodes_gets_ranks_and_peers(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1", gpus=1)
    node(fleet, "n2", gpus=1)
    model(registry, "big", profiles=gpu_profile(tp=2, gpus_per_node=1, nodes=2))
    run(rec)
    loads = workers.loads("big")
    assert sorted(b["rank"] if "rank" in b else 0 for _, b in loads) == [0, 1]
    peers = loads[0][1]["peers"]
    assert len(peers) == 2 and all(b["peers"] == peers for _, b in loads)
    assert all(b["devices"] == [0] for _, b in loads)
    (replica,) = rec.replicas.values()
    assert sorted(replica.nodes) == ["n1", "n2"]
    heartbeat(fleet, rec)
    run(rec)
    assert replica.state == "ready"


def test_a_rolling_restart_replaces_beside_then_stops_the_old(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    node(fleet, "n2")
    model(registry, "chat")
    run(rec)
    heartbeat(fleet, rec)
    run(rec)
    (old,) = rec.replicas.values()
    assert rec.queue_restart([old.id], in_place=False, max_surge=0, max_unavailable=0) == [old.id]
    run(rec)
    assert old.restart == "replacing" and workers.unloads("chat") == []
    heartbeat(fleet, rec)
    run(rec)
    assert workers.unloads("chat") == [old.nodes[0]]
    (new,) = [r for r in rec.replicas.values() if r.state == "ready"]
    assert new.id != old.id and new.nodes != old.nodes


def test_scale_window_reads_overnight_and_days():
    from opod.leader.replicas import window_holds

    night = CatalogScaleWindow(days=["fri"], from_="22:00", to="06:00")
    assert window_holds(night, datetime(2025, 6, 6, 23, 0))  # Friday night
    assert window_holds(night, datetime(2025, 6, 7, 5, 0))  # Saturday morning, the window began Friday
    assert not window_holds(night, datetime(2025, 6, 7, 23, 0))
    assert not window_holds(night, datetime(2025, 6, 6, 12, 0) + timedelta(hours=0))


def test_a_model_with_no_worker_to_go_to_is_waiting_for_one_not_unplaceable(world):
    fleet, registry, workers, rec = world
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    assert registry.get("chat").status.unplaceable and rec.status("chat") == "waiting for a worker"
    node(fleet, "n1", gpus=1, gpu_class="L4")
    run(rec)
    assert rec.status("chat") == "cannot be placed now (explain-placement says why)"


def test_a_worker_that_said_goodbye_is_sent_no_unload_it_stops_its_engines_itself(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1")
    model(registry, "chat")
    run(rec)
    heartbeat(fleet, rec)
    run(rec)
    (replica,) = rec.replicas.values()
    assert replica.state == "ready"
    stopped = nodeapi.EngineState(state="stopped", since="2026-01-01T00:00:00Z", detail="worker stopped")
    fleet.heartbeat(nodeapi.Heartbeat(id="n1", loaded_models=[], engine=stopped))
    run(rec)
    assert replica.state == "failed" and "n1 stopped answering" in replica.error
    assert workers.unloads("chat") == [], "its requests in flight finish within the worker's own stop grace"


def test_a_restart_with_no_room_for_a_replacement_says_why_it_waits(world):
    fleet, registry, workers, rec = world
    node(fleet, "n1", gpus=1)
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    heartbeat(fleet, rec)
    run(rec)
    (old,) = rec.replicas.values()
    assert rec.queue_restart([old.id], in_place=False, max_surge=1, max_unavailable=0) == [old.id]
    run(rec)
    assert old.restart == "queued" and old.state == "ready" and len(rec.replicas) == 1
    assert old.restart_waits.startswith("restart waits: no node can take its replacement beside it (n1: "), (
        old.restart_waits
    )
    assert "--in-place" in old.restart_waits
    node(fleet, "n2", gpus=1)  # a card frees up: the restart goes on and stops saying it waits
    run(rec)
    assert old.restart == "replacing" and old.restart_waits == ""
