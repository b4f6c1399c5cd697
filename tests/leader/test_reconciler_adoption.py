"""A restarted leader adopts the replicas its workers report, in process.

Real fleet, real placement, the recording stand-in for the workers' HTTP of
tests/leader/test_reconciler.py. The workers' heartbeats are played from what each
was asked to load, as a worker reports it (``Heartbeat.replicas``: the replica,
profile, digest and devices of each load). What is checked is what an operator
would see: no load sent for what already runs, the replicas listed under their own
ids with their GPUs, and a new placement that does not take those GPUs twice.
"""

from __future__ import annotations

import asyncio
import time

from opod.catalog.definition import fingerprint
from opod.contract import nodeapi
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.leader.reconciler import Reconciler
from tests.leader.test_reconciler import Workers, gpu_profile, model, node, run


def report(fleet: Fleet, workers: Workers, *, serving: bool = True) -> None:
    """Each worker's heartbeat: every load it was sent and not told to unload since, as its engines report them."""
    held: dict[str, dict[str, nodeapi.HeldReplica]] = {n.id: {} for n in fleet}
    for node_id, path, body in workers.calls:
        if path == nodeapi.PATH_MODEL_LOAD:
            held[node_id][body["id"]] = nodeapi.HeldReplica(
                replica=body["replica"],
                profile=body.get("profile", 0),
                fingerprint=body.get("fingerprint", ""),
                devices=body.get("devices"),
                rank=body.get("rank", 0),
                ranks=len(body.get("peers") or []),
            )
        elif path == nodeapi.PATH_MODEL_UNLOAD:
            held[node_id].pop(body["id"], None)
    time.sleep(0.51)  # a heartbeat after the loads (the reconciler trusts only those)
    for node_id, replicas in held.items():
        loaded = sorted(m for m, h in replicas.items() if serving and h.rank == 0)
        fleet.heartbeat(nodeapi.Heartbeat(id=node_id, loaded_models=loaded, replicas=replicas or None))


def first_leader() -> tuple[Fleet, ModelRegistry, Workers, Reconciler]:
    """The leader before the restart: its fleet and models outlive it, its reconciler does not."""
    fleet, registry, workers = Fleet(), ModelRegistry(), Workers()
    return fleet, registry, workers, Reconciler(fleet, registry, workers)  # type: ignore[arg-type]


def restarted(fleet: Fleet, registry: ModelRegistry) -> tuple[Workers, Reconciler]:
    """A new leader's reconciler over the same workers: it starts knowing no replica."""
    workers = Workers()
    return workers, Reconciler(fleet, registry, workers)  # type: ignore[arg-type]


def test_a_restarted_leader_adopts_each_replica_under_its_id_with_its_gpus_and_loads_nothing():
    fleet, registry, first, rec = first_leader()
    for node_id in ("n1", "n2"):
        node(fleet, node_id, gpus=2)
    model(registry, "chat", profiles=gpu_profile(), scaling={"min": 2, "max": 2})
    run(rec)
    before = {r.id: (r.nodes, r.gpus) for r in rec.replicas.values()}
    report(fleet, first)

    workers, again = restarted(fleet, registry)
    run(again)
    assert workers.calls == []
    assert {r.id: (r.nodes, r.gpus) for r in again.replicas.values()} == before
    assert all(r.state == "ready" for r in again.replicas.values())
    status = registry.get("chat").status
    assert (status.ready, status.desired) == (2, 2)


def test_a_new_model_after_the_restart_gets_gpus_the_adopted_replicas_do_not_hold():
    fleet, registry, first, rec = first_leader()
    node(fleet, "n1", gpus=2)
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    report(fleet, first)
    (held,) = [r.gpus["n1"] for r in rec.replicas.values()]

    workers, again = restarted(fleet, registry)
    model(registry, "code", profiles=gpu_profile())
    run(again)
    ((node_id, body),) = workers.loads("code")
    assert node_id == "n1" and body["devices"] and not set(body["devices"]) & set(held)
    assert workers.loads("chat") == []


def test_a_replica_still_loading_at_the_restart_is_adopted_starting_and_becomes_ready():
    fleet, registry, first, rec = first_leader()
    node(fleet, "n1", gpus=1)
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    report(fleet, first, serving=False)

    workers, again = restarted(fleet, registry)
    run(again)
    (replica,) = again.replicas.values()
    assert replica.state == "starting" and workers.calls == []
    report(fleet, first)
    run(again)
    assert replica.state == "ready" and workers.calls == []


def test_a_replica_across_two_nodes_is_adopted_with_both_ranks_in_order():
    fleet, registry, first, rec = first_leader()
    for node_id in ("n1", "n2"):
        node(fleet, node_id, gpus=1)
    model(registry, "big", profiles=gpu_profile(tp=1, pp=2, nodes=2, gpus_per_node=1))
    run(rec)
    (placed,) = rec.replicas.values()
    assert len(placed.nodes) == 2
    report(fleet, first)

    workers, again = restarted(fleet, registry)
    run(again)
    (adopted,) = again.replicas.values()
    assert (adopted.id, adopted.nodes, adopted.gpus) == (placed.id, placed.nodes, placed.gpus)
    assert workers.calls == []


def test_a_replica_this_leader_stopped_is_not_adopted_back_from_a_late_heartbeat():
    fleet, registry, first, rec = first_leader()
    node(fleet, "n1", gpus=1)
    known = model(registry, "chat", profiles=gpu_profile())
    run(rec)
    report(fleet, first)
    run(rec)
    (replica_id,) = rec.replicas
    late = fleet.get("n1").replicas  # what the worker said before it heard the unload
    known.removed = True
    run(rec)
    assert first.unloads("chat") == ["n1"]
    fleet.heartbeat(nodeapi.Heartbeat(id="n1", loaded_models=["chat"], replicas=late))
    known.removed = False
    run(rec)
    assert replica_id not in rec.replicas


def test_no_new_replica_is_placed_while_a_node_known_from_the_store_has_not_reported():
    fleet, registry, first, rec = first_leader()
    node(fleet, "n1", gpus=1)
    node(fleet, "n2", gpus=1)
    model(registry, "chat", profiles=gpu_profile(), scaling={"min": 1, "max": 1})
    run(rec)
    (placed,) = rec.replicas.values()
    quiet = fleet.get(placed.nodes[0])
    held = report_of(first, quiet.id)

    workers, again = restarted(fleet, registry)
    quiet.last_heartbeat, quiet.inventory.last_seen = 0.0, time.time() - 5  # known from the store, not heard from yet
    run(again)
    assert workers.loads() == [] and again.replicas == {}
    waiting = again.requested("chat")
    assert waiting is not None
    fleet.heartbeat(nodeapi.Heartbeat(id=quiet.id, loaded_models=["chat"], replicas=held))
    run(again)
    assert workers.loads() == [] and list(again.replicas) == [placed.id]
    asyncio.run(asyncio.wait_for(waiting, 5))  # the request waiting meanwhile goes on to the adopted replica


def test_a_replica_from_an_older_definition_is_adopted_and_shown_stale():
    fleet, registry, first, rec = first_leader()
    node(fleet, "n1", gpus=1)
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    report(fleet, first)
    (old,) = rec.replicas.values()
    newer = model(registry, "chat", profiles=gpu_profile(args=["--ctx-size", "4096"]))

    workers, again = restarted(fleet, registry)
    run(again)
    (replica,) = again.replicas.values()
    assert newer.definition is not None
    assert replica.fingerprint == old.fingerprint != fingerprint(newer.definition)  # what ``stale`` compares
    assert workers.calls == []


def report_of(workers: Workers, node_id: str) -> dict[str, nodeapi.HeldReplica]:
    return {
        b["id"]: nodeapi.HeldReplica(
            replica=b["replica"],
            profile=b.get("profile", 0),
            fingerprint=b.get("fingerprint", ""),
            devices=b.get("devices"),
        )
        for n, p, b in workers.calls
        if n == node_id and p == nodeapi.PATH_MODEL_LOAD
    }
