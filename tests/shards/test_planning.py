"""Plan and placement over an in-memory fleet: who coordinates, where parts go, and refusals that name the numbers."""

from __future__ import annotations

import time

import pytest

from opod.catalog import load_catalog
from opod.catalog.loader import bundled_dir
from opod.contract import nodeapi
from opod.contract.catalog import Entry
from opod.fleet.state import NodeState
from opod.shards.errors import ShardError
from opod.shards.planning import place, plan_for, replacement
from opod.shards.records import Coordinator, Gang, Part

CATALOG = load_catalog([bundled_dir()])


def node(node_id: str, ram: int = 16, *, engine: str = "llamacpp", vram: int = 0, **state) -> NodeState:
    gpus = [nodeapi.GPU(name="card", vram_gb=vram)] if vram else None
    hardware = nodeapi.Capabilities(ram_gb=ram, cpu_cores=4, gpus=gpus, engine=engine)
    n = NodeState(id=node_id, address=f"10.0.0.{len(node_id)}:8081", hardware=hardware, last_heartbeat=time.monotonic())
    for key, value in state.items():
        setattr(n, key, value)
    return n


def entry(**sharding) -> Entry:
    base = CATALOG.get("llama-3.2-3b-sharded")
    assert base is not None
    return base.model_copy(update={"sharding": base.sharding.model_copy(update=sharding)})


def test_the_plan_takes_the_catalog_defaults_and_an_explicit_count() -> None:
    plan = plan_for("llama-3.2-3b-sharded", entry(), None)
    assert (plan.shards, plan.port_base) == (2, 50052)
    assert plan.ports(1) == [50053, 50055, 50057, 50059]
    assert plan_for("llama-3.2-3b-sharded", entry(), 3).shards == 3


@pytest.mark.parametrize(
    ("model", "the_entry", "shards", "status", "words"),
    [
        ("nope", None, None, 404, "not in the catalog"),
        ("x", entry(engine="vllm"), None, 400, "'vllm' gang"),
        ("x", entry(), 0, 400, "from 1 to 64, got 0"),
        ("x", entry(), 65, 400, "from 1 to 64, got 65"),
        ("x", entry(rpc_port_base=65530), 4, 400, "needs ports 65530–65545"),
    ],
)
def test_bad_plans_are_refused_with_the_reason(model, the_entry, shards, status, words) -> None:
    with pytest.raises(ShardError) as caught:
        plan_for(model, the_entry, shards)
    assert caught.value.status == status
    assert words in caught.value.message


def test_too_few_workers_names_who_counts_and_why_others_do_not() -> None:
    nodes = [node("n1"), node("n2"), node("n3", drained=True)]
    with pytest.raises(ShardError) as caught:
        place(plan_for("m", entry(), 3), nodes)
    assert caught.value.status == 409
    assert caught.value.message.startswith("need 3 workers, have 2: n1, n2; not counted: n3 (drained)")


def test_the_coordinator_goes_to_the_most_memory_and_takes_part_zero() -> None:
    nodes = [node("n1", 16), node("n2", 64), node("n3", 8, vram=24)]
    placement = place(plan_for("m", entry(), 2), nodes)
    assert placement.coordinator.id == "n3"  # GPU memory first
    assert [n.id for n in placement.parts] == ["n3", "n2"]


def test_a_pinned_coordinator_wins_and_local_means_the_leaders_own_worker() -> None:
    nodes = [node("n1", 64), node("n2", 16), node("lw", 8)]
    assert place(plan_for("m", entry(), 2), nodes, pinned="n2").coordinator.id == "n2"
    assert place(plan_for("m", entry(), 2), nodes, pinned="local", local_node="lw").coordinator.id == "lw"
    with pytest.raises(ShardError, match="runs no worker of its own"):
        place(plan_for("m", entry(), 2), nodes, pinned="local")
    with pytest.raises(ShardError, match="names 'n9', which is not a worker of this leader .known: n1, n2, lw."):
        place(plan_for("m", entry(), 2), nodes, pinned="n9")


def test_a_coordinator_needs_llamacpp_and_must_not_serve_the_model_already() -> None:
    nodes = [node("n1", 64, engine="sim"), node("n2", 32, loaded_models=frozenset({"m"})), node("n3", 16)]
    placement = place(plan_for("m", entry(), 2), nodes)
    assert placement.coordinator.id == "n3"
    with pytest.raises(ShardError, match="n1 .runs the sim engine"):
        place(plan_for("m", entry(), 2), nodes[:2])


def test_workers_the_leader_could_not_reach_are_not_counted() -> None:
    nodes = [node("n1"), node("n2")]
    with pytest.raises(ShardError, match=r"need 2 workers, have 1: n2; not counted: n1 \(did not answer"):
        place(plan_for("m", entry(), 2), nodes, suspect={"n1": "did not answer the leader 1s ago"})


def gang() -> Gang:
    parts = [
        Part(index=i, node=f"n{i + 1}", address=f"10.0.0.2:{50052 + i}", port=50052 + i, process_id=f"p{i}")
        for i in range(2)
    ]
    return Gang(
        id="g1",
        model="m",
        shards=2,
        port_base=50052,
        coordinator=Coordinator(node="n1", address="10.0.0.2:8081"),
        parts=parts,
    )


def test_a_replacement_avoids_the_gangs_other_workers_and_the_gone_one() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    chosen = replacement(gang(), 1, nodes, exclude={"n2": "worker n2 is gone"})
    assert chosen.id == "n3"
    # A failed process on a live worker is started again where it was.
    assert replacement(gang(), 1, nodes, exclude={}).id == "n2"


def test_no_replacement_names_every_worker_and_why() -> None:
    nodes = [node("n1"), node("n2"), node("n3", drained=True)]
    with pytest.raises(ShardError) as caught:
        replacement(gang(), 1, nodes, exclude={"n2": "no heartbeat for 20s"})
    message = caught.value.message
    assert "part 1 of gang g1 (m) has no worker to move to: 3 known, 0 usable" in message
    assert "n1 (holds part 0)" in message and "n2 (no heartbeat for 20s)" in message and "n3 (drained)" in message
