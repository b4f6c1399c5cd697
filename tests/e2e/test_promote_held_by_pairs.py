"""A promotion held to the model's eval gate, on simulators whose answers are known: the model echoes each prompt
back (so it passes every case), the candidate answers random words (so it fails the cases that look for a word of
the prompt, and passes those that accept any answer). The candidate clears the gate's score, but asked the same
cases as the model it loses case after case: the paired comparison holds it back, the model keeps serving as it
was, and the job and an audit row of the system carry every case's two scores."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker, wait_until

STEADY, DRIFTED = "steady", "drifted"
WORDS = ("apple", "river", "copper", "violet", "harbor", "lantern", "meadow", "pepper")
SUITE = "\n".join(
    [
        "description: words of the prompt said back, and two cases any answer passes",
        "threshold: 0.1",
        "max_tokens: 12",
        "cases:",
        *(f"  - id: {word}\n    prompt: say {word}\n    contains: {word}" for word in WORDS),
        "  - id: anything-1\n    prompt: say something\n    regex: '\\S'",
        "  - id: anything-2\n    prompt: say anything\n    regex: '\\S'",
    ]
)


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("promote-held")
    evals = root / "evals"
    evals.mkdir()
    (evals / "said-back.yaml").write_text(SUITE + "\n")
    up = InProcessLeader(root / "leader", env={"OPOD_EVAL_DIR": str(evals)})
    workers: list[OpodProcess] = []
    try:
        for node, mode in (("w_echo", "echo"), ("w_random", "random")):
            flags = json.dumps({"mode": mode, "time_scale": 0, "output_min": 6, "output_max": 6})
            workers.append(sim_worker(up, root / node, node, OPOD_ENGINE_FLAGS=flags))
        for worker in workers:
            worker.wait_for_line("registered with", timeout=30)
        for model, node in ((STEADY, "w_echo"), (DRIFTED, "w_random")):
            body = {"name": model, "profiles": [{"engine": "sim"}], "scaling": {"min": 0}}
            assert up.admin("POST", "/api/v1/models", body)[0] == 200
            assert up.admin("POST", f"/api/v1/models/{model}/load", {"node": node})[0] == 200
        up.wait_served(STEADY, DRIFTED, timeout=60)
        yield up
    finally:
        for worker in workers:
            worker.stop()
        up.stop()


def said_back(leader: InProcessLeader, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "say harbor"}], "max_tokens": 12}
    headers = {"Authorization": f"Bearer {leader.key}", "Content-Type": "application/json"}
    request = urllib.request.Request(leader.url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return str(json.loads(answer.read())["choices"][0]["message"]["content"])


def test_a_candidate_worse_case_by_case_is_held_back_with_the_evidence(leader: InProcessLeader) -> None:
    assert leader.admin("PUT", f"/api/v1/models/{STEADY}/eval-gate", {"suite": "said-back"})[0] == 200
    assert leader.admin("POST", f"/api/v1/models/{STEADY}/canary", {"model": DRIFTED, "percent": 0})[0] == 202
    actor = f"ops-{uuid.uuid4().hex[:6]}@example"
    status, job = leader.admin("POST", f"/api/v1/models/{STEADY}/promote", None, headers={"X-Llmgw-Actor": actor})
    assert status == 202 and job["state"] == "running", job

    def ended() -> dict[str, Any] | None:
        status, kept = leader.admin("GET", f"/api/v1/jobs/{job['id']}")
        assert status == 200, kept
        return dict(kept) if kept["state"] != "running" else None

    done = wait_until(ended, 60, "the promotion's eval step to end")
    assert done["state"] == "failed", done
    assert f"worse than {STEADY} on the same cases" in done["error"] and f"{STEADY} left as it was" in done["error"]
    assert "apple 0.00 (model 1.00)" in done["error"], "the job names the cases with both scores"

    # Nothing moved: the model still echoes, and the canary stands until a person takes it out.
    assert "harbor" in said_back(leader, STEADY)
    status, model = leader.admin("GET", f"/api/v1/models/{STEADY}")
    assert status == 200 and model["canary"]["model"] == DRIFTED

    def held_row() -> dict[str, Any] | None:
        status, rows = leader.admin("GET", f"/api/v1/audit?actor=system&contains={STEADY}/promote")
        assert status == 200, rows
        return rows[0] if rows else None

    row = wait_until(held_row, 10, "the gate's refusal in the audit")
    assert row["status"] == 409 and row["source"] == "leader"
    evidence = json.loads(row["detail"])
    assert evidence["candidate"] == DRIFTED and evidence["job"] == job["id"] and evidence["paired"] == "worse"
    assert evidence["score"] >= evidence["threshold"], "held back by the pairs, not by the score"
    assert evidence["model_score"] == 1.0
    cases = {case["case"]: case for case in evidence["cases"]}
    assert set(cases) == {*WORDS, "anything-1", "anything-2"}
    assert all(cases[word]["model"] == 1.0 and cases[word]["candidate"] == 0.0 for word in WORDS)

    # From the command line, the promotion's progress is followed to the same end, and the exit status says so.
    said = opod_cli(leader, "ctl", "models", "canary", "promote", STEADY, timeout=90)
    assert said.returncode == 1, said
    assert "held back by the eval gate" in said.stdout and f"worse than {STEADY} on the same cases" in said.stdout
    assert "apple 0.00 (model 1.00)" in said.stdout, said.stdout
    leader.admin("DELETE", f"/api/v1/models/{STEADY}/canary")
