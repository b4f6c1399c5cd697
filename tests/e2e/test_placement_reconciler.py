"""Placement made true: a leader, ``opod join`` simulator workers with declared GPUs, the openai client.

Each scenario is what an operator would notice: a request for an on-demand
model is answered (not refused) while its replica starts, and the replica goes
after its idle timeout; a drain moves replicas with no request failing; a
critical model takes an opportunistic one's GPU; a model whose starts keep
failing is parked, and retried.
"""

from __future__ import annotations

import threading

import pytest

from tests.support.gpu_fleet import add, declared_fleet, replicas
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import wait_until

openai = pytest.importorskip("openai")


@pytest.fixture
def fleet(tmp_path):
    with declared_fleet(tmp_path) as made:
        yield made


def client(leader: Leader):
    return openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=60)


def test_an_on_demand_model_starts_on_a_request_and_stops_after_its_idle_timeout(fleet):
    leader, join = fleet
    join("n1")
    add(
        leader,
        {
            "name": "lazy",
            "profiles": [{"engine": "sim"}],
            "scaling": {"min": 0, "max": 1, "idle_timeout": 2_000_000_000},
        },
    )
    assert replicas(leader, "lazy") == []
    answer = client(leader).chat.completions.create(
        model="lazy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.choices[0].message is not None  # answered, not a 503: the request waited for the replica it started
    (replica,) = replicas(leader, "lazy")
    assert replica["state"] == "ready" and replica["shards"][0]["node"] == "n1"
    wait_until(lambda: replicas(leader, "lazy") == [] and "lazy" not in leader.served(), 30, "the idle replica to stop")


def test_a_drain_moves_a_replica_with_no_request_failing(fleet):
    leader, join = fleet
    join("n1")
    add(
        leader,
        {"name": "steady", "profiles": [{"engine": "sim", "gpu_class": "A10G"}], "scaling": {"min": 1, "max": 1}},
    )
    leader.wait_served("steady", timeout=60)
    join("n2")
    first = replicas(leader, "steady")[0]["shards"][0]
    assert first["gpus"] == [0]
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def send():
        api = client(leader)
        while not stop.is_set():
            try:
                api.chat.completions.create(model="steady", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                answered[0] += 1
            except Exception as err:  # every failure is what the test counts
                failures.append(repr(err))

    sender = threading.Thread(target=send)
    sender.start()
    try:
        status, body = leader.admin("POST", f"/api/v1/nodes/{first['node']}/state", {"state": "draining"})
        assert status == 200, body
        other = "n2" if first["node"] == "n1" else "n1"
        wait_until(
            lambda: [r["shards"][0]["node"] for r in replicas(leader, "steady")] == [other], 60, "the replica to move"
        )
        wait_until(lambda: answered[0] > 20, 30, "requests to go on after the move")
    finally:
        stop.set()
        sender.join(30)
    assert failures == []


def test_a_critical_model_preempts_an_opportunistic_one(fleet):
    leader, join = fleet
    join("n1")
    add(leader, {"name": "spare", "class": "opportunistic", "profiles": [{"engine": "sim", "gpu_class": "A10G"}]})
    leader.wait_served("spare", timeout=60)
    add(leader, {"name": "vital", "class": "critical", "profiles": [{"engine": "sim", "gpu_class": "A10G"}]})
    leader.wait_served("vital", timeout=60)
    wait_until(lambda: "spare" not in leader.served(), 30, "the opportunistic model to be stopped")
    status, models = leader.admin("GET", "/api/v1/models")
    spare = next(m for m in models if m["name"] == "spare")
    assert spare.get("preempted") == 1 and spare.get("held_for") == "vital"
    status, summary = leader.admin("GET", "/api/v1/summary")
    assert status == 200 and summary["gpus"] == [{"class": "A10G", "total": 1, "used": 1, "unhealthy": 0}]
    assert "spare" in summary.get("unplaceable", [])


def test_a_model_is_parked_after_repeated_start_failures_and_retried(fleet):
    leader, join = fleet
    join("n1")
    # A profile whose engine arguments the worker refuses (``--port`` is the worker's to set): every start fails.
    add(leader, {"name": "broken", "profiles": [{"engine": "sim", "args": ["--port", "1"]}]})

    def parked():
        status, summary = leader.admin("GET", "/api/v1/summary")
        return [p for p in summary.get("parked", []) if p["model"] == "broken"]

    (record,) = wait_until(parked, 60, "the model to be parked")
    assert record["failures"] == 3 and "--port" in record["reason"]
    status, body = leader.admin("POST", "/api/v1/models/broken/retry", {})
    assert status == 200 and body == {"was_parked": True}
    assert parked() == []
    status, body = leader.admin("POST", "/api/v1/models/broken/retry", {})
    assert body == {"was_parked": False}
