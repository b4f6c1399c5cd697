"""Placement and the operator's engine builds: an engine whose build is ``none`` on a node gets no replica there."""

from __future__ import annotations

from opod.fleet.placement import place
from tests.fleet.test_placement import NOW, gpu, model, node, reasons


def test_a_node_whose_engine_build_is_none_is_refused_naming_the_choice() -> None:
    off, on = node("off", {"H100": 1}), node("on", {"H100": 1})
    off.inventory.operator.engine_builds = {"vllm": "none"}
    assignment, rejections = place("m", model(gpu("H100")), [off, on], [], klass="standard", now=NOW)
    assert assignment is not None and assignment.nodes == ["on"]
    refused, rejections = place("m", model(gpu("H100")), [off], [], klass="standard", now=NOW)
    assert refused is None
    assert reasons(rejections)["off"].startswith("engine: the operator chose no build of vllm on this node")


def test_another_engine_s_none_or_a_named_build_refuses_nothing() -> None:
    state = node("n", {"H100": 1})
    state.inventory.operator.engine_builds = {"sglang": "none", "vllm": "cu129"}
    assignment, _ = place("m", model(gpu("H100")), [state], [], klass="standard", now=NOW)
    assert assignment is not None
