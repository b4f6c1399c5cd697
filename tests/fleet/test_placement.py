"""Placement rules, rule by rule: what fits where, what preempts whom, and why every other node was refused."""

from __future__ import annotations

import time

from opod.contract import nodeapi
from opod.contract.admin.catalog import CatalogGPUNeed, CatalogModel, CatalogProfile, CatalogScaling
from opod.fleet.asks import version_matches
from opod.fleet.inventory import GPUDevice, NodeInventory
from opod.fleet.placed import EVERY_NODE, Held, effective_class
from opod.fleet.placement import Planner, place
from opod.fleet.state import NodeState

NOW = 1000.0

CARDS = {
    "H100": (81920, "9.0"),
    "A100-80GB": (81920, "8.0"),
    "A10G": (24576, "8.6"),
    "T4": (16384, "7.5"),
    "L40S": (49152, "8.9"),
}


def node(
    node_id: str,
    gpus: dict[str, int] | None = None,
    *,
    ram: int = 256,
    cpu: int = 32,
    disk: int = 0,
    engine: str = "vllm",
    versions: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    drained: bool = False,
    unhealthy: tuple[int, ...] = (),
    loaded: tuple[str, ...] = (),
    mig: dict[str, int] | None = None,
    on_disk: list[str] | None = None,
) -> NodeState:
    devices = []
    for gpu_class, count in (gpus or {}).items():
        memory, cc = CARDS[gpu_class]
        for _ in range(count):
            index = len(devices)
            devices.append(
                GPUDevice(
                    index=index,
                    label=str(index),
                    name=f"NVIDIA {gpu_class}",
                    gpu_class=gpu_class,
                    memory_mb=memory,
                    compute_capability=cc,
                    card=index,
                    healthy=index not in unhealthy,
                    why="XID 79" if index in unhealthy else "",
                )
            )
    for profile, count in (mig or {}).items():
        for n in range(count):
            index = len(devices)
            devices.append(
                GPUDevice(
                    index=index,
                    label=f"0/mig{n}",
                    name="NVIDIA A100-SXM4-80GB",
                    gpu_class=f"A100-80GB/{profile}",
                    memory_mb=40960,
                    compute_capability="8.0",
                    card=0,
                    mig_profile=profile,
                )
            )
    state = NodeState(
        id=node_id,
        address=f"10.0.0.{len(node_id)}:8081",
        last_heartbeat=NOW,
        drained=drained,
        hardware=nodeapi.Capabilities(CPUCores=cpu, RAMGB=ram, Engine=engine, DiskFreeGB=disk),
        loaded_models=frozenset(loaded),
    )
    state.inventory = NodeInventory(
        gpus=devices,
        labels=dict(labels or {}),
        engine_versions=dict(versions or {engine: "0.11.1"}),
        models_on_disk=on_disk,
    )
    return state


def model(*profiles: CatalogProfile, klass: str | None = None, **fields) -> CatalogModel:
    return CatalogModel(name="m", profiles=list(profiles), class_=klass, **fields)


def gpu(gpu_class: str | None = None, **fields) -> CatalogProfile:
    return CatalogProfile(engine=fields.pop("engine", "vllm"), gpu_class=gpu_class, **fields)


def reasons(rejections) -> dict[str, str]:
    return {r.node: r.reason for r in rejections}


# --- fits ---------------------------------------------------------------------------------------


def test_a_model_that_fits_takes_the_tightest_node_and_its_lowest_free_devices() -> None:
    nodes = [node("big", {"H100": 8}), node("small", {"H100": 4})]
    held = [Held("r1", "other", 0, "standard", gpus={"small": [0, 1]})]
    assignment, rejections = place("m", model(gpu("H100", tp=2)), nodes, held, klass="standard", now=NOW)
    assert assignment is not None and rejections == []
    assert assignment.nodes == ["small"] and assignment.gpus == {"small": [2, 3]}
    assert assignment.gpu_class == "H100" and assignment.preempts == []


def test_tensor_parallel_across_two_nodes_gives_each_rank_its_devices() -> None:
    nodes = [node("a", {"H100": 4}), node("b", {"H100": 4}), node("c", {"A10G": 4})]
    assignment, _ = place(
        "m", model(gpu("H100", tp=4, pp=2, nodes=2, gpus_per_node=4)), nodes, [], klass="standard", now=NOW
    )
    assert assignment is not None
    assert assignment.nodes == ["a", "b"] and assignment.gpus == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}


def test_a_replica_across_nodes_that_cannot_find_enough_nodes_says_so_on_each_that_fits() -> None:
    nodes = [node("a", {"H100": 4}), node("b", {"H100": 2})]
    assignment, rejections = place("m", model(gpu("H100", tp=8, nodes=2)), nodes, [], klass="standard", now=NOW)
    assert assignment is None
    why = reasons(rejections)
    assert why["a"].startswith("nodes: a replica needs 2 nodes with 4 free H100 each; 1 fit (a)")
    assert why["b"] == "gpus: needs 4 H100 on one node, has 2"


def test_keep_within_keeps_the_ranks_in_one_rack() -> None:
    rack = "llmgw.io/rack"
    nodes = [
        node("a", {"H100": 8}, labels={rack: "r1"}),
        node("b", {"H100": 8}, labels={rack: "r2"}),
        node("c", {"H100": 8}, labels={rack: "r2"}),
        node("d", {"H100": 8}),
    ]
    assignment, _ = place(
        "m", model(gpu("H100", tp=8, pp=2, nodes=2, keep_within="rack")), nodes, [], klass="standard", now=NOW
    )
    assert assignment is not None and assignment.nodes == ["b", "c"]


def test_a_gpu_need_takes_the_least_card_that_meets_it() -> None:
    nodes = [node("h", {"H100": 8}), node("l", {"L40S": 8}), node("t", {"T4": 8})]
    need = CatalogProfile(engine="vllm", gpu=CatalogGPUNeed(min_compute_capability=8.0, min_memory_gb=40))
    assignment, _ = place("m", model(need), nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["l"] and assignment.gpu_class == "L40S"
    assignment, rejections = place("m", model(need), [nodes[2]], [], klass="standard", now=NOW)
    assert assignment is None
    assert reasons(rejections)["t"] == "gpu: wants compute capability ≥ 8 and ≥ 40 GB, node has T4 ×8 (7.5, 16 GB)"


def test_a_mig_instance_is_a_class_of_its_own() -> None:
    nodes = [node("mig", {"A100-80GB": 0}, mig={"3g.40gb": 2}), node("whole", {"A100-80GB": 2})]
    assignment, _ = place("m", model(gpu("A100-80GB/3g.40gb")), nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["mig"] and assignment.gpus == {"mig": [0]}
    assignment, _ = place("m", model(gpu("A100-80GB")), nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["whole"]


def test_without_profiles_any_live_node_whose_engine_fits_and_the_emptiest_first() -> None:
    nodes = [
        node("busy", loaded=("x", "y"), engine="sim"),
        node("idle", engine="sim"),
        node("llama", engine="llamacpp"),
    ]
    assignment, rejections = place("m", CatalogModel(name="m"), nodes, [], klass="standard", now=NOW, engine="sim")
    assert assignment is not None and assignment.nodes == ["idle"] and assignment.gpus == {"idle": []}
    assert rejections == []
    assignment, rejections = place("m", CatalogModel(name="m"), [nodes[2]], [], klass="standard", now=NOW, engine="sim")
    assert assignment is None
    assert rejections[0].pool == "cpu" and rejections[0].reason == "engine: wants sim, node has llamacpp"


def test_profiles_are_tried_highest_priority_first_and_a_later_one_catches_what_the_first_cannot() -> None:
    nodes = [node("cpu-only", engine="llamacpp", versions={"llamacpp": "b4500"})]
    definition = model(gpu("H100", name="fast", priority=10), CatalogProfile(name="cpu", engine="llamacpp", priority=1))
    assignment, rejections = place("m", definition, nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.profile == 1 and assignment.nodes == ["cpu-only"]
    assert [(r.profile, r.pool, r.reason) for r in rejections] == [
        ("fast", "H100", "engine: wants vllm, node has llamacpp")
    ]
    # Priority decides, not the order written.
    nodes = [node("both", {"H100": 1}, engine="vllm", versions={"vllm": "0.11.0", "llamacpp": "b4500"})]
    definition = model(CatalogProfile(name="cpu", engine="llamacpp"), gpu("H100", name="fast", priority=5))
    assignment, _ = place("m", definition, nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.profile == 1


# --- refusals, per node and by how much ------------------------------------------------------------


def test_one_that_cannot_fit_is_explained_per_node() -> None:
    nodes = [
        node("held", {"H100": 4}),
        node("wrong", {"A10G": 4}),
        node("bare", {}),
        node("drained", {"H100": 8}, drained=True),
        node("sglang", {"H100": 8}, engine="sglang", versions={"sglang": "0.4.1"}),
        node("eu", {"H100": 8}, labels={"zone": "eu"}),
        node("old", {"H100": 8}, versions={"vllm": "0.10.2"}),
        node("sick", {"H100": 2}, unhealthy=(0,)),
        node("small", {"H100": 8}, ram=32),
    ]
    held = [Held("r1", "qwen-7b", 0, "standard", gpus={"held": [0, 1, 2]}, memory_gb=8)]
    definition = model(gpu("H100", tp=2, engine_version="0.11", node_selector={"zone": "us"}, min_memory_gb=64))
    for n in nodes:
        if n.id != "eu":
            n.inventory.labels["zone"] = "us"
    assignment, rejections = place("m", definition, nodes, held, klass="standard", now=NOW)
    assert assignment is None
    assert {r.profile for r in rejections} == {"0"} and {r.pool for r in rejections} == {"H100"}
    assert reasons(rejections) == {
        "held": "gpus: needs 2 free H100, has 1 free (3 held by qwen-7b)",
        "wrong": "gpu_class: wants H100, node has A10G ×4",
        "bare": "gpu_class: node has no GPU",
        "drained": "node: drained",
        "sglang": "engine: wants vllm, node has sglang",
        "eu": "node_selector: wants zone=us, node has zone=eu",
        "old": "engine_version: wants vllm 0.11*, node has vllm 0.10.2",
        "sick": "gpus: needs 2 H100 on one node, has 1 (1 more unhealthy)",
        "small": "min_memory_gb: needs 64 GB of host RAM free, has 32 (32, 0 reserved)",
    }


def test_unhealthy_devices_are_never_given() -> None:
    nodes = [node("n", {"H100": 4}, unhealthy=(0, 2))]
    assignment, _ = place("m", model(gpu("H100", tp=2)), nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.gpus == {"n": [1, 3]}
    assignment, rejections = place(
        "m", model(gpu("H100", tp=2)), [node("n", {"H100": 1}, unhealthy=(0,))], [], klass="standard", now=NOW
    )
    assert (
        assignment is None and reasons(rejections)["n"] == "gpus: needs 2 H100, every one here is unhealthy (0: XID 79)"
    )


def test_host_memory_and_cores_count_what_held_replicas_reserve() -> None:
    nodes = [node("n", ram=64, cpu=16)]
    held = [Held("r1", "a", 0, "standard", gpus={"n": []}, memory_gb=40, cpu_cores=12)]
    cpu = CatalogProfile(engine="vllm", min_memory_gb=32)
    _, rejections = place("m", model(cpu), nodes, held, klass="standard", now=NOW)
    assert reasons(rejections)["n"] == "min_memory_gb: needs 32 GB of host RAM free, has 24 (64, 40 reserved by a)"
    _, rejections = place(
        "m", model(CatalogProfile(engine="vllm", cpu_cores=8)), nodes, held, klass="standard", now=NOW
    )
    assert reasons(rejections)["n"] == "cpu_cores: needs 8 cores free, has 4 (16, 12 reserved by a)"
    assignment, _ = place(
        "m", model(CatalogProfile(engine="vllm", cpu_cores=4, min_memory_gb=24)), nodes, held, klass="standard", now=NOW
    )
    assert assignment is not None and (assignment.cpu_cores, assignment.memory_gb) == (4, 24)


def test_a_node_that_does_not_say_its_memory_or_disk_is_not_excluded() -> None:
    nodes = [node("quiet", ram=0, cpu=0, disk=0)]
    assignment, _ = place(
        "m",
        model(CatalogProfile(engine="vllm", min_memory_gb=512, cpu_cores=64, min_disk_gb=900)),
        nodes,
        [],
        klass="standard",
        now=NOW,
    )
    assert assignment is not None


def test_disk_is_asked_only_of_a_node_without_the_weights() -> None:
    nodes = [node("full", disk=20), node("has-it", disk=20, on_disk=["m"])]
    definition = model(CatalogProfile(engine="vllm", min_disk_gb=100))
    assignment, rejections = place("m", definition, nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["has-it"]
    _, rejections = place("m", definition, nodes[:1], [], klass="standard", now=NOW)
    assert reasons(rejections)["full"] == "min_disk_gb: needs 100 GB free for the weights, has 20 GB"


def test_a_node_takes_one_replica_of_a_model() -> None:
    nodes = [node("a", {"H100": 8}), node("b", {"H100": 8}, loaded=("m",))]
    held = [Held("r1", "m", 0, "standard", gpus={"a": [0]})]
    assignment, rejections = place("m", model(gpu("H100")), nodes, held, klass="standard", now=NOW)
    assert assignment is None
    assert set(reasons(rejections).values()) == {
        "replica: already holds a replica of m (a worker runs one engine per model)"
    }


def test_engine_version_is_a_prefix_of_whole_parts() -> None:
    assert (
        version_matches("0.11.0", "0.11") and version_matches("0.11.1", "0.11") and version_matches("v0.11.1", "0.11")
    )
    assert not version_matches("0.10.2", "0.11") and not version_matches("0.110.0", "0.11")
    assert version_matches("0.11.0", "0.11.0")


def test_a_malformed_profile_is_refused_once_for_every_node() -> None:
    assignment, rejections = place(
        "m", model(gpu("H100", tp=8, gpus_per_node=4, nodes=3)), [node("a", {"H100": 8})], [], klass="standard", now=NOW
    )
    assert assignment is None and len(rejections) == 1
    assert rejections[0].node == EVERY_NODE and rejections[0].reason.startswith("profile: tp×pp = 8 GPUs a replica")


def test_exclude_names_why_the_caller_ruled_a_node_out() -> None:
    _, rejections = place(
        "m",
        model(gpu("H100")),
        [node("a", {"H100": 1})],
        [],
        klass="standard",
        now=NOW,
        exclude={"a": "the model is unloaded there"},
    )
    assert reasons(rejections) == {"a": "node: the model is unloaded there"}


def test_a_node_without_heartbeats_is_not_placed_on() -> None:
    stale = node("stale", {"H100": 8})
    stale.last_heartbeat = NOW - 60
    _, rejections = place("m", model(gpu("H100")), [stale], [], klass="standard", now=NOW)
    assert reasons(rejections)["stale"] == "node: no heartbeat for 60s (limit 15s)"


# --- classes and preemption ---------------------------------------------------------------------


def test_a_critical_model_preempts_an_opportunistic_one_when_there_is_no_free_room() -> None:
    nodes = [node("n", {"H100": 2})]
    held = [
        Held("opp-1", "cheap", 0, "opportunistic", gpus={"n": [0]}),
        Held("std-1", "normal", 0, "standard", gpus={"n": [1]}),
    ]
    assignment, _ = place("m", model(gpu("H100")), nodes, held, klass="critical", now=NOW)
    assert assignment is not None and assignment.preempts == ["opp-1"] and assignment.gpus == {"n": [0]}
    # Standard may take opportunistic room, never standard's.
    assignment, _ = place("m", model(gpu("H100", tp=2)), nodes, held, klass="standard", now=NOW)
    assert assignment is None
    assignment, rejections = place("m", model(gpu("H100")), nodes, held, klass="opportunistic", now=NOW)
    assert (
        assignment is None
        and reasons(rejections)["n"] == "gpus: needs 1 free H100, has 0 free (2 held by cheap, normal)"
    )


def test_free_room_anywhere_wins_over_preempting_and_then_the_fewest_are_stopped() -> None:
    nodes = [node("full", {"H100": 2}), node("free", {"H100": 2}, engine="vllm")]
    held = [Held("o1", "cheap", 0, "opportunistic", gpus={"full": [0, 1]})]
    assignment, _ = place("m", model(gpu("H100")), nodes, held, klass="critical", now=NOW)
    assert assignment is not None and assignment.nodes == ["free"] and assignment.preempts == []
    # A free fit on a later profile also wins over preempting on the first.
    nodes = [node("full", {"H100": 2}, versions={"vllm": "0.11.0", "llamacpp": "b1"})]
    definition = model(gpu("H100", name="gpu"), CatalogProfile(name="cpu", engine="llamacpp"))
    assignment, _ = place("m", definition, nodes, held, klass="critical", now=NOW)
    assert assignment is not None and assignment.profile == 1 and assignment.preempts == []
    # Of two nodes that need preempting, the one that stops fewer replicas.
    nodes = [node("two", {"H100": 2}), node("one", {"H100": 2})]
    held = [
        Held("a", "x", 0, "opportunistic", gpus={"two": [0]}),
        Held("b", "y", 0, "opportunistic", gpus={"two": [1]}),
        Held("c", "z", 0, "opportunistic", gpus={"one": [0, 1]}),
    ]
    assignment, _ = place("m", model(gpu("H100", tp=2)), nodes, held, klass="critical", now=NOW)
    assert assignment is not None and assignment.nodes == ["one"] and assignment.preempts == ["c"]
    assignment, _ = place("m", model(gpu("H100", tp=2)), nodes, held, klass="critical", now=NOW, preempt=False)
    assert assignment is None


def test_effective_class_is_standard_or_opportunistic_on_demand() -> None:
    assert effective_class(CatalogModel()) == "standard"
    assert effective_class(CatalogModel(scaling=CatalogScaling(min=0, max=2))) == "opportunistic"
    assert effective_class(CatalogModel(scaling=CatalogScaling(min=1))) == "standard"
    assert effective_class(CatalogModel(class_="critical", scaling=CatalogScaling(min=0))) == "critical"


# --- a pass: the planner remembers -------------------------------------------------------------------


def test_the_planner_sees_what_it_took_and_what_it_released() -> None:
    planner = Planner([node("a", {"H100": 2}), node("b", {"H100": 1})], [], now=NOW)
    first, _ = planner.place("x", model(gpu("H100")), klass="standard")
    assert first is not None and first.nodes == ["b"]
    planner.take(first, "x-1", "critical")
    second, _ = planner.place("y", model(gpu("H100", tp=2)), klass="standard")
    assert second is not None and second.nodes == ["a"]
    planner.take(second, "y-1", "opportunistic")
    third, rejections = planner.place("z", model(gpu("H100")), klass="standard", preempt=False)
    assert third is None and len(rejections) == 2
    third, _ = planner.place("z", model(gpu("H100")), klass="critical")
    assert third is not None and third.preempts == ["y-1"]
    planner.take(third, "z-1", "critical")
    fourth, _ = planner.place("w", model(gpu("H100")), klass="standard")
    assert fourth is not None and fourth.nodes == ["a"] and fourth.gpus == {"a": [1]}
    planner.take(fourth, "w-1", "standard")
    planner.release("x-1")
    fifth, _ = planner.place("v", model(gpu("H100")), klass="standard")
    assert fifth is not None and fifth.nodes == ["b"]


def test_placing_is_deterministic() -> None:
    def run() -> list:
        nodes = [node(f"n{i}", {"H100": 8 if i % 2 else 4}) for i in range(20)]
        planner = Planner(nodes, [], now=NOW)
        out = []
        for i in range(30):
            assignment, _ = planner.place(f"m{i}", model(gpu("H100", tp=1 + i % 4)), klass="standard")
            assert assignment is not None
            planner.take(assignment, f"m{i}-0", "standard")
            out.append((assignment.nodes, assignment.gpus))
        return out

    assert run() == run()


def test_an_external_model_is_never_placed() -> None:
    from opod.contract.admin.catalog import CatalogExternal

    assignment, rejections = place(
        "m",
        CatalogModel(external=CatalogExternal(url="https://api.example")),
        [node("a")],
        [],
        klass="standard",
        now=NOW,
    )
    assert assignment is None and rejections[0].reason.startswith("external: served by https://api.example")


def test_five_hundred_models_on_a_thousand_nodes_is_quick() -> None:
    """Not the benchmark (bench/ has figures); a guard that the index is used, with a generous bound."""
    nodes = [node(f"n{i:04d}", {"H100" if i % 2 else "A100-80GB": 8}) for i in range(1000)]
    start = time.perf_counter()
    planner = Planner(nodes, [], now=NOW)
    for i in range(500):
        assignment, _ = planner.place(
            f"m{i}", model(gpu("H100" if i % 2 else "A100-80GB", tp=1 + i % 4)), klass="standard"
        )
        assert assignment is not None
        planner.take(assignment, f"m{i}-0", "standard")
    assert time.perf_counter() - start < 5.0
