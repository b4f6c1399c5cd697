"""Canaries on simulators: a share of a model's requests goes to a candidate, which is rolled back by itself when it
fails or is slow over its minimum of requests, kept when healthy, copied to in shadow, and promoted."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import opod_cli, sim_worker, wait_until

STABLE, CANDIDATE = "chat", "chat-next"
FAST = json.dumps({"time_scale": 0.05})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("canaries")
    leader = InProcessLeader(root / "leader")
    workers = {
        node: sim_worker(leader, root / node, node, OPOD_ENGINE_FLAGS=FAST) for node in ("w_stable", "w_candidate")
    }
    for worker in workers.values():
        worker.wait_for_line("registered with", timeout=30)
    for model, node in ((STABLE, "w_stable"), (CANDIDATE, "w_candidate")):
        body = {"name": model, "profiles": [{"engine": "sim"}], "scaling": {"min": 0}}
        assert leader.admin("POST", "/api/v1/models", body)[0] == 200
        assert leader.admin("POST", f"/api/v1/models/{model}/load", {"node": node})[0] == 200
    leader.wait_served(STABLE, CANDIDATE, timeout=60)
    status, made = leader.admin("POST", "/api/v1/keys", {"name": "client"})
    assert status == 201, made
    leader.client_key = made["secret"]
    yield leader, workers
    for worker in workers.values():
        worker.stop()
    leader.stop()


@pytest.fixture
def candidate(fleet) -> Any:
    """The candidate's engine, its faults cleared after each test, and no canary left behind."""
    leader, workers = fleet
    url = re.findall(rf"{CANDIDATE} serving on (http://127\.0\.0\.1:\d+)", workers["w_candidate"].output)[-1]
    yield url
    set_faults(url, fail_rate=0.0, stall_rate=0.0)
    leader.admin("DELETE", f"/api/v1/models/{STABLE}/canary")


def set_faults(url: str, **settings: object) -> None:
    request = urllib.request.Request(
        url + "/sim/faults", json.dumps(settings).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    urllib.request.urlopen(request, timeout=5).read()


def chat(
    leader: InProcessLeader, model: str = STABLE, *, key: str = "", request_id: str = "", stream: bool = False
) -> tuple[int, dict[str, str]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "stream": stream}
    headers = {
        "Authorization": f"Bearer {key or leader.client_key}",
        "Content-Type": "application/json",
        "X-Request-Id": request_id or uuid.uuid4().hex,
    }
    request = urllib.request.Request(leader.url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        error.read()
        return error.code, {k.lower(): v for k, v in error.headers.items()}


def many(leader: InProcessLeader, count: int, *, ids: str = "", **kwargs: Any) -> list[tuple[int, dict[str, str]]]:
    """``count`` chats at once, 8 at a time; ``ids``: the requests' ids are it and their number, so the groups they
    are drawn to (a hash of the id) are the same every run; else each id is new."""
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda n: chat(leader, request_id=f"{ids}{n}" if ids else "", **kwargs), range(count)))


def canary_of(leader: InProcessLeader) -> dict[str, Any] | None:
    status, model = leader.admin("GET", f"/api/v1/models/{STABLE}")
    assert status == 200, model
    return model.get("canary")


def start(leader: InProcessLeader, **canary: Any) -> dict[str, Any]:
    status, job = leader.admin("POST", f"/api/v1/models/{STABLE}/canary", {"model": CANDIDATE, **canary})
    assert status == 202, job
    return job


def rollback_row(leader: InProcessLeader) -> dict[str, Any]:
    status, rows = leader.admin("GET", f"/api/v1/audit?actor=system&contains={STABLE}")
    assert status == 200, rows
    assert rows, "the rollback is an audit row of the system"
    return json.loads(rows[0]["detail"])


def until_rolled_back(leader: InProcessLeader, most: int, **kwargs: Any) -> int:
    """Requests sent, in rounds of 20, until the canary is gone; fails past ``most``."""
    sent = 0
    while canary_of(leader) is not None:
        assert sent < most, f"the candidate was not rolled back after {sent} requests"
        many(leader, 20, **kwargs)
        sent += 20
        time.sleep(0.2)
    return sent


def test_a_twenty_percent_canary_gets_about_a_fifth_and_clients_cannot_name_the_candidate(fleet, candidate) -> None:
    leader, _ = fleet
    job = start(leader, percent=20, min_requests=100_000)
    assert job["kind"] == "canary" and job["state"] == "succeeded" and job["model"] == STABLE
    assert leader.admin("GET", f"/api/v1/jobs/{job['id']}")[1] == job, "kept with every job"

    answers = many(leader, 500, ids="split-")  # fixed ids: a fifth within 0.05 every run, not 99.5 % of runs
    assert {status for status, _ in answers} == {200}
    workers = Counter(headers["x-opod-worker"] for _, headers in answers)
    assert abs(workers["w_candidate"] / 500 - 0.20) <= 0.05, workers
    routes = Counter(re.search(r"canary=([\w.-]+)", h["x-opod-route"]).group(1) for _, h in answers)  # type: ignore[union-attr]
    assert routes[CANDIDATE] == workers["w_candidate"], "the usage row's route names the group drawn"

    first = chat(leader, request_id="same-request")[1]["x-opod-worker"]
    assert {chat(leader, request_id="same-request")[1]["x-opod-worker"] for _ in range(5)} == {first}

    assert chat(leader, CANDIDATE)[0] == 404, "a client cannot name the candidate"
    assert chat(leader, CANDIDATE, key=leader.key)[0] == 200, "the admin key can"
    listed = json.loads(
        urllib.request.urlopen(
            urllib.request.Request(leader.url + "/v1/models", headers={"Authorization": f"Bearer {leader.client_key}"})
        ).read()
    )
    assert CANDIDATE not in {m["id"] for m in listed["data"]}

    status, canaries = leader.admin("GET", "/api/v1/canaries")
    assert status == 200 and [c["model"] for c in canaries] == [STABLE]
    serving = canaries[0]["serving"]
    assert serving["canary"] == CANDIDATE and serving["candidate"]["errors"] == 0
    assert serving["candidate"]["requests"] >= workers["w_candidate"]

    status, done = leader.admin("PUT", f"/api/v1/models/{STABLE}/canary", {"percent": 50})
    assert status == 200 and "50%" in done["result"]
    assert canary_of(leader)["percent"] == 50

    status, done = leader.admin("DELETE", f"/api/v1/models/{STABLE}/canary", headers={"X-Llmgw-Actor": "alice"})
    assert status == 200 and "share went to 0, then the candidate" in done["result"]
    assert canary_of(leader) is None
    assert {h["x-opod-worker"] for _, h in many(leader, 40)} == {"w_stable"}
    assert chat(leader, CANDIDATE)[0] == 200, "no longer a candidate: clients may name it again"
    status, rows = leader.admin("GET", "/api/v1/audit?actor=alice")
    assert rows[0]["action"] == "DELETE /api/v1/models/{name}/canary"


def test_a_failing_candidate_is_rolled_back_by_itself_with_the_numbers(fleet, candidate) -> None:
    leader, _ = fleet
    set_faults(candidate, fail_rate=1.0, fail_status=500)
    start(leader, percent=50, min_requests=20)
    until_rolled_back(leader, 400)
    detail = rollback_row(leader)
    assert detail["rule"] == "errors" and detail["candidate"] == CANDIDATE
    assert detail["candidate_requests"] >= 20 and detail["stable_requests"] >= 20
    assert detail["candidate_error_rate"] == 1.0 and detail["stable_error_rate"] == 0.0
    assert "failed" in detail["reason"] and "above the 5.0 allowed" in detail["reason"]
    assert {h["x-opod-worker"] for _, h in many(leader, 20)} == {"w_stable"}, "its share went back to the model"


def test_fewer_than_min_requests_never_act(fleet, candidate) -> None:
    leader, _ = fleet
    set_faults(candidate, fail_rate=1.0, fail_status=500)
    start(leader, percent=50, min_requests=60)
    many(leader, 60)  # about 30 for the candidate, all failing: fewer than its 60
    time.sleep(2.5)  # two rounds of the watch
    assert canary_of(leader) is not None, "fewer than min_requests of its own: no verdict"
    status, canaries = leader.admin("GET", "/api/v1/canaries")
    assert 0 < canaries[0]["serving"]["candidate"]["errors"] < 60


def test_a_slow_candidate_is_rolled_back_on_its_time_to_first_token(fleet, candidate) -> None:
    leader, _ = fleet
    set_faults(candidate, stall_rate=1.0, stall_ms=400, stall_at="first")
    start(leader, percent=50, min_requests=20)
    until_rolled_back(leader, 400, stream=True)
    detail = rollback_row(leader)
    assert detail["rule"] == "ttft", detail
    assert detail["ttft_ratio"] >= 1.5 and detail["candidate_ttft_ms"] >= 300


def test_a_healthy_candidate_is_kept_then_promoted(fleet, candidate) -> None:
    leader, _ = fleet
    start(leader, percent=50, min_requests=20)
    answers = many(leader, 120, stream=True)
    assert {status for status, _ in answers} == {200}
    time.sleep(2.5)
    assert canary_of(leader) is not None, "a healthy candidate is kept"
    serving = leader.admin("GET", "/api/v1/canaries")[1][0]["serving"]
    assert serving["candidate"]["ttft_count"] >= 20 and serving["stable"]["ttft_count"] >= 20

    status, job = leader.admin("POST", f"/api/v1/models/{STABLE}/promote", {"skip_eval": True})
    assert status == 202, job
    assert job["kind"] == "promote" and job["state"] == "succeeded", job
    steps = {s["name"]: s for s in job["steps"]}
    assert steps["eval"]["state"] == "skipped" and "skip_eval" in steps["eval"]["detail"]
    assert steps["take over"]["state"] == "done"
    assert job["id"] in {j["id"] for j in leader.admin("GET", "/api/v1/jobs")[1]}
    assert canary_of(leader) is None


def test_a_shadow_candidate_gets_copies_and_answers_nothing(fleet, candidate) -> None:
    leader, _ = fleet
    start(leader, percent=0, min_requests=100_000)
    answers = many(leader, 60)
    assert {h["x-opod-worker"] for _, h in answers} == {"w_stable"}, "no client is answered by a shadow"
    wait_until(
        lambda: leader.admin("GET", "/api/v1/canaries")[1][0]["serving"]["candidate"]["requests"] >= 50,
        30,  # copies are sent after the answers, behind whatever else a loaded machine runs
        "the shadow copies to be counted",
    )


def test_bad_canaries_are_refused_naming_the_field(fleet, candidate) -> None:
    leader, _ = fleet
    status, body = leader.admin("POST", f"/api/v1/models/{STABLE}/canary", {"model": "no-such", "percent": 10})
    assert status == 404 and body["error"].startswith("model:")
    status, body = leader.admin("POST", f"/api/v1/models/{STABLE}/canary", {"model": CANDIDATE, "percent": 101})
    assert status == 400 and "percent" in body["error"]
    status, body = leader.admin("POST", f"/api/v1/models/{STABLE}/canary", {"model": STABLE})
    assert status == 400 and "not the model itself" in body["error"]
    status, body = leader.admin("PUT", f"/api/v1/models/{STABLE}/canary", {"percent": 10})
    assert status == 404 and "has no canary" in body["error"]
    assert canary_of(leader) is None


def test_opod_ctl_sets_shares_lists_and_removes_a_canary(fleet, candidate) -> None:
    leader, _ = fleet

    def ctl(*args: str) -> str:
        done = opod_cli(leader, "ctl", "models", "canary", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    said = ctl("set", STABLE, CANDIDATE, "--percent", "10", "--min-requests", "500")
    assert "canary of chat set (job job_" in said
    job_id = said.split("(job ")[1].split(")")[0]
    jobs = opod_cli(leader, "ctl", "serve-jobs", "ls")
    row = next(line for line in jobs.stdout.splitlines() if line.startswith(job_id))
    assert row.split()[1:3] == ["canary", STABLE] and "succeeded" in row, jobs.stdout
    assert "takes 30%" in ctl("share", STABLE, "30")
    many(leader, 20)
    listed = ctl("ls")
    assert CANDIDATE in listed and "30%" in listed
    assert "taken out" in ctl("rm", STABLE)
    done = opod_cli(leader, "ctl", "models", "canary", "share", STABLE, "10")
    assert done.returncode == 1 and "has no canary" in done.stderr
