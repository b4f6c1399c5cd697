"""The routing-decision benchmark times the decisions it says it times."""

from __future__ import annotations

from bench.routing import decision


def test_each_scenario_makes_the_decision_it_is_named_for() -> None:
    cases = decision.scenarios(workers=100)
    made = {name: decide() for name, decide in cases.items()}
    load, three, shared, pin, stress = made.values()
    assert load.reason == "load" and load.of_blocks == 0
    assert (
        three.reason == "prefix"
        and three.node.id in {"w000", "w033", "w066"}
        and three.blocks == decision.PROMPT_BLOCKS
    )
    assert (shared.reason, shared.node.id, shared.blocks) == ("prefix", "w099", decision.PROMPT_BLOCKS), (
        "the conversation's holder"
    )
    assert pin.reason == "load" and pin.of_blocks == 0, "no worker reports the prompt and nothing is pinned yet"
    assert stress.reason == "prefix" and stress.blocks > 1 and stress.of_blocks == decision.PROMPT_BLOCKS
    assert [name for name in cases if name == decision.STRESS] == [list(cases)[-1]]


def test_measure_gives_a_p50_and_p99_per_scenario() -> None:
    costs = decision.measure(workers=20, samples=200)
    assert [c.scenario for c in costs] == list(decision.scenarios(workers=20))
    assert all(0 < c.p50 <= c.p99 < 0.05 and c.samples == 200 for c in costs)
    assert [c.scenario for c in costs if not c.judged] == [decision.STRESS]
