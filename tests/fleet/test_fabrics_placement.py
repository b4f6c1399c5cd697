"""Placement and the wiring: a replica across nodes stays on one fabric, a node with a down adapter takes part in none,
and tensor parallel on one node takes cards that are NVLink peers of each other."""

from __future__ import annotations

from opod.fleet.placed import Held
from opod.fleet.placement import Planner, place
from opod.fleet.state import NodeState
from tests.fleet.test_placement import NOW, gpu, model, node, reasons

ACTIVE, DOWN = "active", "down"


def on(state: NodeState, **fabrics: dict[str, str]) -> NodeState:
    """``state`` on the fabrics given (name → adapter → port state)."""
    state.inventory.fabrics = {name.replace("_", "-"): dict(ports) for name, ports in fabrics.items()}
    return state


def wired(state: NodeState, *groups: tuple[int, ...]) -> NodeState:
    """``state`` with each group of cards NVLink peers of each other."""
    for device in state.inventory.gpus:
        device.nvlink_peers = tuple(sorted({c for g in groups if device.card in g for c in g} - {device.card}))
    return state


TWO_NODES = model(gpu("H100", tp=8, nodes=2))


def test_a_two_node_replica_lands_on_two_nodes_of_one_fabric_not_across_two() -> None:
    nodes = [
        on(node("a", {"H100": 4}), ib_a={"mlx5_0": ACTIVE}),
        on(node("b", {"H100": 4}), ib_b={"mlx5_0": ACTIVE}),
        on(node("c", {"H100": 4}), ib_b={"mlx5_0": ACTIVE}),
    ]
    assignment, _ = place("m", TWO_NODES, nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["b", "c"]


def test_nodes_on_different_fabrics_are_refused_with_the_fabric_rule() -> None:
    nodes = [
        on(node("a", {"H100": 4}), ib_a={"mlx5_0": ACTIVE}),
        on(node("b", {"H100": 4}), ib_b={"mlx5_0": ACTIVE}),
        node("c", {"H100": 4}),
    ]
    assignment, rejections = place("m", TWO_NODES, nodes, [], klass="standard", now=NOW)
    assert assignment is None
    why = reasons(rejections)
    assert set(why) == {"a", "b", "c"}
    assert why["a"].startswith("fabric: a replica across 2 nodes stays on one fabric")
    assert "ib-a 1 (a); ib-b 1 (b); no fabric 1 (c)" in why["a"] and why["a"] == why["c"]


def test_nodes_on_no_fabric_share_the_machine_network() -> None:
    nodes = [node("a", {"H100": 4}), on(node("b", {"H100": 4}), ib_a={"mlx5_0": ACTIVE}), node("c", {"H100": 4})]
    assignment, _ = place("m", TWO_NODES, nodes, [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["a", "c"]


def test_a_node_with_a_down_adapter_is_refused_for_a_replica_across_nodes_with_the_adapter_named() -> None:
    nodes = [
        on(node("a", {"H100": 4}), ib_a={"mlx5_0": ACTIVE, "mlx5_1": DOWN}),
        on(node("b", {"H100": 4}), ib_a={"mlx5_0": ACTIVE}),
    ]
    assignment, rejections = place("m", TWO_NODES, nodes, [], klass="standard", now=NOW)
    assert assignment is None
    why = reasons(rejections)
    assert why["a"].startswith("fabric: multi_node is down: mlx5_1 (adapters whose ports are not active)")
    assert why["b"].startswith("nodes: a replica needs 2 nodes")
    alone, _ = place("m", model(gpu("H100", tp=4)), nodes[:1], [], klass="standard", now=NOW)
    assert alone is not None and alone.nodes == ["a"]  # its own single-node replicas run either way


def test_a_node_on_two_fabrics_pairs_on_either() -> None:
    nodes = [
        on(node("a", {"H100": 4}), ib_a={"mlx5_0": ACTIVE}, ib_b={"mlx5_1": ACTIVE}),
        on(node("z", {"H100": 4}), ib_b={"mlx5_0": ACTIVE}),
    ]
    planner = Planner(nodes, [], now=NOW)
    assignment, _ = planner.place("m", TWO_NODES, klass="standard")
    assert assignment is not None and sorted(assignment.nodes) == ["a", "z"]


def test_the_scan_keeps_to_one_fabric_when_the_replica_must_preempt() -> None:
    nodes = [
        on(node("a", {"H100": 4}), ib_a={"mlx5_0": ACTIVE}),
        on(node("b", {"H100": 4}), ib_b={"mlx5_0": ACTIVE}),
        on(node("c", {"H100": 4}), ib_b={"mlx5_0": ACTIVE}),
    ]
    held = [Held("low", "other", 0, "opportunistic", gpus={"c": [0, 1, 2, 3]})]
    assignment, _ = place("m", TWO_NODES, nodes, held, klass="critical", now=NOW)
    assert assignment is not None and assignment.nodes == ["b", "c"] and assignment.preempts == ["low"]


def test_tensor_parallel_on_one_node_takes_nvlink_peers() -> None:
    box = wired(node("a", {"H100": 8}), (0, 2), (1, 3, 5, 7))
    held = [Held("r1", "other", 0, "standard", gpus={"a": [1]})]
    two, rejections = place("m", model(gpu("H100", tp=2)), [box], held, klass="standard", now=NOW)
    assert two is not None and two.gpus == {"a": [0, 2]} and rejections == []
    three, _ = place("m", model(gpu("H100", tp=3)), [box], held, klass="standard", now=NOW)
    assert three is not None and three.gpus == {"a": [3, 5, 7]}


def test_without_a_linked_set_any_free_cards_do_and_nothing_is_refused() -> None:
    box = wired(node("a", {"H100": 4}), (0, 1))
    held = [Held("r1", "other", 0, "standard", gpus={"a": [1]})]
    assignment, rejections = place("m", model(gpu("H100", tp=2)), [box], held, klass="standard", now=NOW)
    assert assignment is not None and assignment.gpus == {"a": [0, 2]} and rejections == []
