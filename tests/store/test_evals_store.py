"""Quality runs in the store: written as they start, a case at a time, ended; listed newest first; left runs failed."""

from __future__ import annotations

from dataclasses import replace

from opod.store import Store
from opod.store.audit import AuditRow
from opod.store.evals import EvalCaseRecord, EvalRunRecord
from tests.store.conftest import at


def a_run(run_id: str, model: str, seconds: float, owner: str = "host:/home") -> EvalRunRecord:
    return EvalRunRecord(
        id=run_id,
        model=model,
        target="",
        suite="arithmetic",
        suite_hash="ab" * 32,
        source="built in",
        at=at(seconds),
        threshold=0.8,
        cases=2,
        by="ops",
        owner=owner,
    )


def a_case(seq: int, score: float) -> EvalCaseRecord:
    return EvalCaseRecord(
        seq=seq,
        case_id=f"c{seq}",
        kind="regex",
        weight=1.0,
        prompt="What is 2+2?",
        expected="^4$",
        answer="4" if score else "5",
        score=score,
        passed=score >= 0.5,
        detail="matches",
        took_ms=12,
        request_id=f"r-{seq}",
    )


def test_a_run_is_kept_as_it_starts_a_case_at_a_time_and_as_it_ends(store: Store) -> None:
    audit = AuditRow(
        actor="ops",
        source="api",
        action="POST /api/v1/models/{name}/eval",
        target="model:m",
        detail="{}",
        status=202,
        at=at(0),
    )
    store.insert_eval_run(a_run("eval_1", "m", 0), audit=audit)
    started = store.get_eval_run("eval_1")
    assert started is not None and started.state == "running" and started.done == 0 and started.results == ()
    assert [a.action for a in store.list_audit()] == ["POST /api/v1/models/{name}/eval"]
    store.add_eval_case("eval_1", a_case(1, 0.0))
    store.add_eval_case("eval_1", a_case(0, 1.0))
    running = store.get_eval_run("eval_1")
    assert running is not None and running.done == 2 and [c.case_id for c in running.results] == ["c0", "c1"]
    assert running.results[0] == a_case(0, 1.0)
    store.finish_eval_run(replace(running, state="done", score=0.5, passed=False, below=1, took_ms=40, results=()))
    ended = store.get_eval_run("eval_1")
    assert ended is not None and (ended.state, ended.score, ended.passed, ended.below, ended.took_ms) == (
        "done",
        0.5,
        False,
        1,
        40,
    )
    assert store.get_eval_run("eval_none") is None


def test_runs_list_newest_first_by_model_with_their_progress(store: Store) -> None:
    for i, model in enumerate(["m", "other", "m"]):
        store.insert_eval_run(a_run(f"eval_{i}", model, i))
    store.add_eval_case("eval_2", a_case(0, 1.0))
    listed = store.list_eval_runs()
    assert [r.id for r in listed] == ["eval_2", "eval_1", "eval_0"]
    assert listed[0].done == 1 and listed[1].done == 0 and listed[0].results == ()
    assert [r.id for r in store.list_eval_runs(model="m", limit=1)] == ["eval_2"]


def test_a_leader_s_unfinished_runs_are_failed_when_it_starts_again(store: Store) -> None:
    store.insert_eval_run(a_run("eval_mine", "m", 0))
    store.insert_eval_run(a_run("eval_theirs", "m", 1, owner="other:/home"))
    assert store.abandon_eval_runs("host:/home", "the leader stopped") == ["eval_mine"]
    mine, theirs = store.get_eval_run("eval_mine"), store.get_eval_run("eval_theirs")
    assert mine is not None and (mine.state, mine.error) == ("failed", "the leader stopped")
    assert theirs is not None and theirs.state == "running"
