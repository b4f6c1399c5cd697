"""A leader adopts the engines its workers report and no replica accounts for (after a restart), in process.

Real fleet, real placement, the recording stand-in for the workers' HTTP of
tests/leader/test_reconciler.py; heartbeats are played by hand. What is checked is
what an operator would see: no load sent for what already serves, the replicas
listed with their GPUs and age, and what no longer fits replaced, not kept.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from opod.contract import nodeapi
from opod.contract.wire import format_time
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.leader.reconciler import Reconciler
from tests.leader.test_reconciler import Workers, gpu_profile, model, node, run


def serving(fleet: Fleet, node_id: str, *models: str, for_seconds: float = 0.0) -> None:
    """A heartbeat of ``node_id`` whose engines serve ``models`` (for ``for_seconds`` already)."""
    since = format_time(datetime.now(UTC) - timedelta(seconds=for_seconds))
    fleet.heartbeat(nodeapi.Heartbeat(id=node_id, loaded_models=sorted(models),
                                      model_engines={m: nodeapi.EngineState(state="serving", since=since) for m in models}))


def fresh() -> tuple[Fleet, ModelRegistry, Workers, Reconciler]:
    fleet, registry, workers = Fleet(), ModelRegistry(), Workers()
    return fleet, registry, workers, Reconciler(fleet, registry, workers)  # type: ignore[arg-type]


def test_served_engines_are_adopted_with_their_gpus_and_age_and_nothing_is_loaded():
    fleet, registry, workers, rec = fresh()
    for node_id in ("n1", "n2"):
        node(fleet, node_id, gpus=2)
        serving(fleet, node_id, "chat", for_seconds=120)
    known = model(registry, "chat", profiles=gpu_profile(), scaling={"min": 2, "max": 2})
    run(rec)
    assert workers.calls == []
    listed = rec.replica_list()
    assert [(r.nodes, r.gpus, r.state, r.unfit) for r in sorted(listed, key=lambda r: r.nodes)] == [
        (["n1"], {"n1": [0]}, "ready", ""), (["n2"], {"n2": [0]}, "ready", "")]
    assert all(time.monotonic() - r.started >= 119 for r in listed)
    status = known.status
    assert (status.ready, status.desired, status.unplaceable) == (2, 2, False)
    run(rec)
    assert workers.calls == [] and len(rec.replicas) == 2


def test_an_adopted_replica_keeps_the_id_it_was_placed_under():
    fleet, registry, workers, rec = fresh()
    node(fleet, "n1", gpus=1)
    model(registry, "chat", profiles=gpu_profile())
    run(rec)
    (placed,) = rec.replicas
    serving(fleet, "n1", "chat")
    again = Reconciler(fleet, registry, Workers())  # type: ignore[arg-type]
    run(again)
    assert list(again.replicas) == [placed]


def test_one_that_no_longer_fits_is_replaced_elsewhere_before_it_stops():
    fleet, registry, workers, rec = fresh()
    node(fleet, "n1", gpus=1, gpu_class="A10G")
    node(fleet, "n2", gpus=1, gpu_class="H100")
    serving(fleet, "n1", "chat")
    fleet.heartbeat(nodeapi.Heartbeat(id="n2", loaded_models=[]))
    model(registry, "chat", profiles=gpu_profile("H100"))
    run(rec)
    (old,) = [r for r in rec.replicas.values() if r.nodes == ["n1"]]
    assert old.unfit.startswith("gpu") and old.gpus == {}
    assert [n for n, _ in workers.loads("chat")] == ["n2"] and workers.unloads("chat") == []
    time.sleep(0.51)
    serving(fleet, "n1", "chat")
    serving(fleet, "n2", "chat")
    run(rec)
    assert workers.unloads("chat") == ["n1"]
    (kept,) = [r for r in rec.replicas.values() if r.state == "ready"]
    assert kept.nodes == ["n2"] and kept.gpus == {"n2": [0]}


def test_more_served_than_wanted_are_stopped_down_to_the_count():
    fleet, registry, workers, rec = fresh()
    for node_id in ("n1", "n2"):
        node(fleet, node_id, gpus=1)
        serving(fleet, node_id, "chat")
    model(registry, "chat", profiles=gpu_profile(), scaling={"min": 1, "max": 1})
    run(rec)
    assert len(workers.unloads("chat")) == 1 and workers.loads() == []
    assert len([r for r in rec.replicas.values() if r.state == "ready"]) == 1
    run(rec)  # the stopped one's worker has not reported since: not adopted again
    assert len(workers.unloads("chat")) == 1 and len(rec.replicas) == 1


def test_no_new_replica_is_placed_while_a_node_known_from_the_store_has_not_reported():
    fleet, registry, workers, rec = fresh()
    node(fleet, "n1", gpus=1)
    quiet = node(fleet, "n2", gpus=1)
    quiet.last_heartbeat, quiet.inventory.last_seen = 0.0, time.time() - 5  # restored, not heard from since the start
    model(registry, "chat", profiles=gpu_profile(), scaling={"min": 1, "max": 1})
    run(rec)
    assert workers.loads() == [] and rec.replicas == {}
    waiting = rec.requested("chat")
    assert waiting is not None
    serving(fleet, "n2", "chat")
    run(rec)
    assert workers.loads() == [] and [r.nodes for r in rec.replicas.values()] == [["n2"]]
    asyncio.run(asyncio.wait_for(waiting, 5))  # the request waiting meanwhile goes on to the adopted replica


def test_a_model_pinned_to_a_node_by_the_operator_is_not_adopted_as_a_replica():
    fleet, registry, workers, rec = fresh()
    node(fleet, "n1", gpus=1)
    serving(fleet, "n1", "chat")
    known = model(registry, "chat", profiles=gpu_profile(), scaling={"min": 0, "max": 1})
    known.wanted["n1"] = "loaded"
    run(rec)
    assert rec.replicas == {} and workers.unloads("chat") == []


def test_a_removed_model_s_engines_are_adopted_and_stopped():
    fleet, registry, workers, rec = fresh()
    node(fleet, "n1", gpus=1)
    serving(fleet, "n1", "gone")
    known = model(registry, "gone", profiles=gpu_profile())
    known.removed = True
    run(rec)
    assert workers.unloads("gone") == ["n1"] and workers.loads() == []
