"""The paired comparison: a candidate against the model it would replace, case by case, deciding only on enough pairs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from opod.control.evals.compare import compare_runs
from opod.store.evals import EvalCaseRecord, EvalRunRecord

T0 = datetime(2026, 3, 4, tzinfo=UTC)


def run(scores: dict[str, float | None], *, state: str = "done", suite_hash: str = "h1") -> EvalRunRecord:
    """A finished run whose cases scored ``scores`` (``None``: the case got no answer)."""
    results = tuple(
        EvalCaseRecord(
            seq=i,
            case_id=case,
            kind="exact",
            weight=1.0,
            prompt="p",
            expected="e",
            score=value or 0.0,
            passed=(value or 0.0) >= 0.5,
            error="" if value is not None else "the gateway answered 503: no replica",
        )
        for i, (case, value) in enumerate(scores.items())
    )
    return EvalRunRecord(
        id=f"eval_{len(scores)}",
        model="m",
        target="",
        suite="s",
        suite_hash=suite_hash,
        source="built in",
        at=T0,
        threshold=0.8,
        state=state,
        results=results,
        done=len(results),
        cases=len(results),
    )


def test_pairs_count_wins_losses_and_ties_and_a_clear_loss_is_worse() -> None:
    baseline = run({"a": 1, "b": 1, "c": 1, "d": 0, "e": 1})
    candidate = run({"a": 1, "b": 0, "c": 0, "d": 1, "e": 1})
    found = compare_runs(baseline, candidate, min_pairs=5)
    assert (found.wins, found.losses, found.ties) == (1, 2, 2)
    assert found.baseline_score == pytest.approx(0.8) and found.candidate_score == pytest.approx(0.6)
    assert found.decision == "worse"
    assert "candidate 0.600 against 0.800 (-0.200, margin 0.050)" in found.reason
    assert [p.outcome for p in found.pairs] == ["tie", "loss", "loss", "win", "tie"]


def test_equal_answers_are_the_same_and_a_clear_gain_is_better() -> None:
    same = compare_runs(run({"a": 1, "b": 0}), run({"a": 1, "b": 0}), min_pairs=2)
    assert same.decision == "same" and same.ties == 2
    better = compare_runs(run({"a": 0, "b": 0}), run({"a": 1, "b": 0.5}), min_pairs=2)
    assert better.decision == "better" and better.wins == 2


def test_a_case_either_side_did_not_answer_is_missing_never_a_loss() -> None:
    baseline = run({"a": 1, "b": 1, "c": None})
    candidate = run({"a": 1, "b": None, "c": 0})
    found = compare_runs(baseline, candidate, min_pairs=1)
    assert [p.case for p in found.pairs] == ["a"] and found.missing == ("b", "c")
    assert found.losses == 0 and found.decision == "same"


def test_no_decision_on_fewer_pairs_than_the_minimum() -> None:
    found = compare_runs(run({"a": 1, "b": 1, "c": None}), run({"a": 0, "b": 0, "c": None}), min_pairs=3)
    assert found.decision == "insufficient" and found.losses == 2
    assert found.reason.startswith("2 cases answered by both, fewer than the 3 a decision needs")


def test_no_decision_on_an_unfinished_run_or_different_suites() -> None:
    done = run({"a": 1})
    failed = replace(run({"a": 0}), state="failed", error="no case got an answer")
    assert compare_runs(done, failed, min_pairs=1).decision == "insufficient"
    assert "candidate run eval_1 is failed: no case got an answer" in compare_runs(done, failed, min_pairs=1).reason
    other = run({"a": 0}, suite_hash="h2")
    assert compare_runs(done, other, min_pairs=1).decision == "insufficient"
    assert "different suites" in compare_runs(done, other, min_pairs=1).reason
    with pytest.raises(ValueError):
        compare_runs(done, done, min_pairs=0)
