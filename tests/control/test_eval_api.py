"""Quality suites and runs on one real leader with an ``opod join`` simulator worker.

The simulator answers in echo mode (the last user message repeated back), so what each case's
answer is, and so its verdict, is known: a regex or JSON-schema case whose prompt carries its
own answer passes, an arithmetic question repeated back does not. Each case is a ``/v1``
request the gateway serves as the system's own, and its usage row says which run it was.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opod.control.evals.builtin import built_in_suites
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker, usage_rows, wait_until

MODEL, JUDGE = "sim-eval", "sim-judge"
NODE = "n_evals"

GOOD_SUITE = """\
description: a regex case and a JSON-schema case the echo passes, and one it fails
threshold: 0.6
cases:
  - id: number
    prompt: the answer is 42
    regex: '\\b42\\b'
  - id: person
    prompt: '{"name": "Ada", "age": 36}'
    json_schema:
      type: object
      required: [name, age]
      properties:
        name: {type: string}
        age: {type: integer}
  - id: wrong-type
    prompt: '{"name": "Ada", "age": "old"}'
    json_schema: {type: object, properties: {age: {type: integer}}}
"""

BAD_SUITE = """\
cases:
  - id: fine
    prompt: hello
    contains: hello
  - id: broken
    prompt: hello
    regex: '(unclosed'
"""


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("evals")
    evals = root / "evals"
    evals.mkdir()
    (evals / "echoes.yaml").write_text(GOOD_SUITE)
    (evals / "broken.yaml").write_text(BAD_SUITE)
    up = Leader(root / "leader", env={"OPOD_EVAL_DIR": str(evals)})
    worker: OpodProcess | None = None
    try:
        # A few milliseconds a token, so a run at one case at a time is seen midway.
        flags = {"mode": "echo", "output_min": 40, "output_max": 40, "ttft_ms": 5.0, "itl_ms": 4.0}
        worker = sim_worker(up, root / "worker", NODE, OPOD_ENGINE_FLAGS=json.dumps(flags))
        worker.wait_for_line("registered with", timeout=30)
        for model in (MODEL, JUDGE):
            added = opod_cli(up, "model", "add", model, "--engine", "sim")
            assert added.returncode == 0, added.stderr
        up.wait_served(MODEL, JUDGE, timeout=60)
        yield up
    finally:
        if worker is not None:
            worker.stop()
        up.stop()


def finished(leader: Leader, run_id: str) -> dict:
    def ended() -> dict | None:
        status, body = leader.admin("GET", f"/api/v1/eval/runs/{run_id}")
        assert status == 200, body
        return body if body["state"] != "running" else None

    return wait_until(ended, 60, f"quality run {run_id} to end")


def start(leader: Leader, body: dict, model: str = MODEL) -> dict:
    status, run = leader.admin("POST", f"/api/v1/models/{model}/eval", body, headers={"X-Llmgw-Actor": "ops@example"})
    assert status == 202, run
    return run


def test_the_suites_are_the_built_in_ones_and_the_directory_s_with_the_broken_file_and_why(leader: Leader) -> None:
    status, suites = leader.admin("GET", "/api/v1/eval/suites")
    assert status == 200
    by_name = {s["name"]: s for s in suites}
    assert by_name["arithmetic"]["from"] == "built in" and by_name["arithmetic"]["cases"] == 6
    assert by_name["json-format"]["from"] == "built in"
    assert by_name["echoes"]["cases"] == 3 and by_name["echoes"]["threshold"] == 0.6
    assert by_name["echoes"]["from"].endswith("echoes.yaml") and "error" not in by_name["echoes"]
    broken = by_name["broken"]
    assert "cases" not in broken, "a broken suite is listed with its error, never half-loaded"
    assert broken["from"].endswith("broken.yaml")
    assert "broken.yaml" in broken["error"] and "'broken' (cases[1])" in broken["error"] and "regex" in broken["error"]


def test_a_broken_suite_is_refused_by_name_with_its_reason(leader: Leader) -> None:
    status, body = leader.admin("POST", f"/api/v1/models/{MODEL}/eval", {"suite": "broken"})
    assert status == 400 and set(body) == {"error"}
    assert "broken.yaml" in body["error"] and "cases[1]" in body["error"] and "regex" in body["error"]
    status, body = leader.admin("POST", f"/api/v1/models/{MODEL}/eval", {"content": "cases: []", "file": "mine.yaml"})
    assert status == 400 and "mine.yaml" in body["error"] and "cases" in body["error"]
    status, body = leader.admin("POST", f"/api/v1/models/{MODEL}/eval", {"suite": "nope"})
    assert status == 400 and "arithmetic" in body["error"]
    status, body = leader.admin("POST", "/api/v1/models/no-such-model/eval", {"suite": "arithmetic"})
    assert status == 404 and "no-such-model" in body["error"]
    status, runs = leader.admin("GET", "/api/v1/eval/runs?model=no-such-model")
    assert status == 200 and runs == []


def test_arithmetic_runs_to_the_end_through_v1_with_a_usage_row_per_case(leader: Leader) -> None:
    run = start(leader, {"suite": "arithmetic", "concurrency": 2})
    assert run["state"] == "running" and run["cases"] == 6 and run["suite"] == "arithmetic"
    assert "passed" not in run, "a running run has no verdict yet"
    done = finished(leader, run["id"])
    assert done["state"] == "done" and done["done"] == 6 and done["by"] == "ops@example"
    suite = built_in_suites()["arithmetic"]
    assert done["suite_hash"] == suite.hash
    results = {r["id"]: r for r in done["results"]}
    assert list(results) == [c.id for c in suite.cases]
    for case in suite.cases:
        result = results[case.id]
        # The echo repeats the question back: each verdict is what the regex says of the answer recorded.
        assert result["answer"].startswith(case.prompt[:10])
        assert result["passed"] is bool(re.search(case.expected, result["answer"]))
        assert result["score"] == (1.0 if result["passed"] else 0.0) and result["kind"] == "regex"
        assert "match" in result["detail"] and "error" not in result
    assert done["score"] == sum(r["score"] for r in results.values()) / 6
    assert done["passed"] is (done["score"] >= 0.8)
    assert done["below"] == sum(not r["passed"] for r in results.values()) and done["errors"] == 0

    def every_row() -> list[Any] | None:
        # Each row is offered once the ledger commits it, a moment after its answer.
        found = [e.data for e in usage_rows(leader) if e.data.request_id.startswith(run["id"] + "-")]
        return found if len(found) >= 6 else None

    rows = wait_until(every_row, 15, "the run's usage rows")
    assert len(rows) == 6
    for row in rows:
        assert row.model == MODEL and row.outcome == "ok" and row.api_key_id


def test_the_run_s_requests_are_attributed_to_the_system_and_the_run(leader: Leader) -> None:
    run = finished(leader, start(leader, {"suite": "echoes"})["id"])
    request_id = f"{run['id']}-0"
    record = wait_until(
        lambda: (lambda s, b: b if s == 200 else None)(*leader.admin("GET", f"/api/v1/requests/{request_id}")),
        15,
        "the case's request record",
    )
    assert record["end_user"] == "opod-eval"
    assert record["tags"]["eval_run"] == run["id"] and record["tags"]["eval_suite"] == "echoes"
    assert record["key_id"]  # the admin key: the system's own


def test_a_run_s_progress_is_live_while_it_runs(leader: Leader) -> None:
    run = start(leader, {"suite": "arithmetic", "concurrency": 1})

    def midway() -> dict | None:
        status, body = leader.admin("GET", f"/api/v1/eval/runs/{run['id']}")
        assert status == 200 and body["state"] == "running", body
        return body if 0 < body["done"] < body["cases"] else None

    seen = wait_until(midway, 30, "the run midway", interval=0.02)
    assert len(seen["results"]) == seen["done"] and seen["cases"] == 6 and "passed" not in seen
    assert seen["score"] == sum(r["score"] for r in seen["results"]) / seen["done"]
    status, listed = leader.admin("GET", f"/api/v1/eval/runs?model={MODEL}&limit=1")
    assert status == 200 and listed[0]["id"] == run["id"] and listed[0]["state"] == "running"
    assert finished(leader, run["id"])["done"] == 6


def test_a_suite_file_with_a_regex_case_and_a_json_schema_case(leader: Leader) -> None:
    run = finished(leader, start(leader, {"suite": "echoes", "min_score": 0.5})["id"])
    results = {r["id"]: r for r in run["results"]}
    assert results["number"]["passed"] is True and results["number"]["kind"] == "regex"
    assert results["person"]["passed"] is True and results["person"]["kind"] == "json_schema"
    assert results["wrong-type"]["passed"] is False
    assert results["wrong-type"]["detail"].startswith("$.age: 'old' is not of type 'integer'")
    assert run["score"] == pytest.approx(2 / 3) and run["threshold"] == 0.5 and run["passed"] is True
    assert run["below"] == 1

    status, listed = leader.admin("GET", f"/api/v1/eval/runs?model={MODEL}&limit=1")
    assert status == 200 and [r["id"] for r in listed] == [run["id"]]
    assert "results" not in listed[0] and listed[0]["done"] == 3


def test_a_suite_sent_whole_with_a_judge(leader: Leader) -> None:
    suite = "cases:\n  - id: tone\n    prompt: '7'\n    rubric: says a number\n"
    status, body = leader.admin("POST", f"/api/v1/models/{MODEL}/eval", {"content": suite, "file": "mine.yaml"})
    assert status == 400 and "judge" in body["error"]
    run = start(leader, {"content": suite, "file": "mine.yaml", "judge": JUDGE})
    assert run["suite"] == "mine" and run["judge"] == JUDGE
    done = finished(leader, run["id"])
    (case,) = done["results"]
    # The judge echoes its grading prompt back, which quotes the question: its first number, 7, is the grade.
    assert case["kind"] == "rubric" and case["answer"].startswith("7")
    assert case["score"] == 0.7 and case["passed"] is True and case["detail"].startswith("the judge gave 7/10")
    assert done["judge"] == JUDGE and done["state"] == "done"


def test_the_gate_is_set_read_deleted_and_audited(leader: Leader) -> None:
    actor = {"X-Llmgw-Actor": "gatekeeper@example"}
    status, body = leader.admin("PUT", f"/api/v1/models/{MODEL}/eval-gate", {"suite": "nope"}, headers=actor)
    assert status == 400 and "suite" in body["error"]
    status, body = leader.admin("PUT", f"/api/v1/models/{MODEL}/eval-gate", {"suite": "echoes", "min_score": 2})
    assert status == 400 and "min_score" in body["error"]
    status, gate = leader.admin(
        "PUT", f"/api/v1/models/{MODEL}/eval-gate", {"suite": "echoes", "min_score": 0.5}, headers=actor
    )
    assert status == 200 and gate == {"model": MODEL, "eval": {"suite": "echoes", "min_score": 0.5}}
    status, model = leader.admin("GET", f"/api/v1/models/{MODEL}")
    assert status == 200 and model["eval"] == {"suite": "echoes", "min_score": 0.5}
    status, gone = leader.admin("DELETE", f"/api/v1/models/{MODEL}/eval-gate", headers=actor)
    assert status == 200 and gone == {"model": MODEL}
    status, model = leader.admin("GET", f"/api/v1/models/{MODEL}")
    assert "eval" not in model
    status, audit = leader.admin("GET", "/api/v1/audit?actor=gatekeeper@example")
    assert status == 200
    actions = [(a["action"], a["status"]) for a in audit]
    assert ("PUT /api/v1/models/{name}/eval-gate", 200) in actions
    assert ("PUT /api/v1/models/{name}/eval-gate", 400) in actions
    assert ("DELETE /api/v1/models/{name}/eval-gate", 200) in actions


def test_the_gate_passes_a_candidate_that_answers_as_well_and_says_why(leader: Leader) -> None:
    evals = leader.leader.control.evals
    status, _ = leader.admin("PUT", f"/api/v1/models/{MODEL}/eval-gate", {"suite": "echoes", "min_score": 0.5})
    assert status == 200
    try:
        verdict = leader.call(evals.gate_passes(MODEL, JUDGE, job="job_test"))
    finally:
        leader.admin("DELETE", f"/api/v1/models/{MODEL}/eval-gate")
    assert verdict.decided and verdict.passed, verdict.reason
    assert verdict.run is not None and verdict.run.target == JUDGE and verdict.run.job == "job_test"
    assert verdict.comparison is not None and verdict.comparison.decision == "same"
    assert verdict.comparison.ties == 3 and verdict.comparison.wins == verdict.comparison.losses == 0
    assert "passed: score 0.667 against 0.500" in verdict.reason
    no_gate = leader.call(evals.gate_passes(JUDGE, MODEL))
    assert no_gate.passed and "no eval gate" in no_gate.reason


def test_the_run_is_kept_in_the_store(leader: Leader) -> None:
    run = finished(leader, start(leader, {"suite": "json-format"})["id"])
    kept = leader.leader.store.get_eval_run(run["id"])
    assert kept is not None and kept.state == "done" and len(kept.results) == 4
    first = kept.results[0]
    assert first.prompt == built_in_suites()["json-format"].cases[0].prompt
    assert first.expected == built_in_suites()["json-format"].cases[0].expected and first.request_id == f"{run['id']}-0"


def test_ctl_lists_suites_runs_a_suite_with_progress_and_sets_the_gate(leader: Leader) -> None:
    suites = opod_cli(leader, "ctl", "eval", "suites")
    assert suites.returncode == 0, suites.stderr
    assert "arithmetic" in suites.stdout and "broken" in suites.stdout
    ran = opod_cli(leader, "ctl", "eval", "run", MODEL, "echoes", "--wait")
    assert ran.returncode == 0, ran.stderr
    assert "echoes" in ran.stdout and "passed" in ran.stdout and "wrong-type" in ran.stdout
    listed = opod_cli(leader, "ctl", "eval", "runs", "--model", MODEL)
    assert listed.returncode == 0 and "echoes" in listed.stdout
    gate = opod_cli(leader, "ctl", "eval", "gate", "set", MODEL, "echoes", "--min-score", "0.5")
    assert gate.returncode == 0, gate.stderr
    assert "echoes" in opod_cli(leader, "ctl", "eval", "gate", "show", MODEL).stdout
    removed = opod_cli(leader, "ctl", "eval", "gate", "remove", MODEL)
    assert removed.returncode == 0 and "no eval gate" in removed.stdout
