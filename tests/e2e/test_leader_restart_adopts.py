"""A restarted leader adopts the replicas its workers still serve, through real processes.

One leader, two ``opod join`` simulator workers with one declared A10G each, and a
model that wants two replicas. The leader is stopped (Ctrl-C) and started again on
the same home and ports while an ``openai`` client keeps sending: what an operator
notices is that the same replicas are listed again (ids, nodes, GPUs, endpoints,
age), no engine was started again, and no request failed once the leader was back.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.gpu_fleet import ONE_A10G, add, replicas
from tests.support.opod_process import Leader, descendants, remove_home, sim_worker, wait_until

openai = pytest.importorskip("openai")

MODEL = "pair"


def _shape(listed: list[dict]) -> list[tuple]:
    return sorted(
        (r["id"], r["endpoint"], r["state"], tuple((s["node"], tuple(s["gpus"])) for s in r["shards"])) for r in listed
    )


def _count(listed: object) -> int:
    return len(listed) if isinstance(listed, list) else 0


def _engines(workers) -> list[list[int]]:
    """Each worker's child processes: the simulator engine it started."""
    return [sorted(descendants(w.proc.pid)) for w in workers]


@pytest.fixture(scope="module")
def restart(tmp_path_factory):
    """The fleet before and after a leader restart with requests flowing through it."""
    root = tmp_path_factory.mktemp("adopt")
    leader = Leader(root / "leader", worker=False, extra=["--no-default-models"])
    ports = (leader.port, leader.admin_port)
    token = leader.node_token()
    workers = []
    facts: dict = {}
    try:
        for node_id in ("n1", "n2"):
            home = root / node_id
            home.mkdir()
            (home / "inventory.yaml").write_text(ONE_A10G)
            workers.append(sim_worker(leader, home, node_id, token=token, OPOD_INVENTORY=str(home / "inventory.yaml")))
        wait_until(lambda: _count(leader.admin("GET", "/api/v1/nodes")[1]) == 2, 60, "both workers to join")
        add(
            leader,
            {"name": MODEL, "profiles": [{"engine": "sim", "gpu_class": "A10G"}], "scaling": {"min": 2, "max": 2}},
        )
        wait_until(
            lambda: [r["state"] for r in replicas(leader, MODEL)] == ["ready", "ready"], 60, "two ready replicas"
        )
        leader.wait_served(MODEL, timeout=30)
        facts["before"] = replicas(leader, MODEL)
        facts["before_at"] = time.monotonic()
        facts["engines_before"] = _engines(workers)

        down = threading.Event()
        stop = threading.Event()
        failures: list[str] = []
        answered_after: list[float] = []
        key = leader.key

        def send() -> None:
            api = openai.OpenAI(base_url=f"http://127.0.0.1:{ports[0]}/v1", api_key=key, max_retries=0, timeout=30)
            while not stop.is_set():
                while_down = down.is_set()
                try:
                    api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                    if not down.is_set():
                        answered_after.append(time.monotonic())
                except Exception as err:  # every failure is what the test counts
                    if while_down or down.is_set():
                        time.sleep(0.05)  # the leader's own downtime: retry
                    else:
                        failures.append(repr(err))

        sender = threading.Thread(target=send)
        sender.start()
        try:
            wait_until(lambda: len(answered_after) >= 5, 30, "requests to be answered before the restart")
            down.set()
            leader.process.stop()
            leader = Leader(root / "leader", worker=False, extra=["--no-default-models"], ports=ports)
            back = time.monotonic()
            down.clear()
            wait_until(
                lambda: _shape(replicas(leader, MODEL)) == _shape(facts["before"]), 30, "the replicas to be adopted"
            )
            wait_until(
                lambda: sum(1 for t in answered_after if t > back) >= 20,
                30,
                "requests to be answered after the restart",
            )
        finally:
            stop.set()
            sender.join(60)
        facts["after"] = replicas(leader, MODEL)
        facts["after_at"] = time.monotonic()
        facts["since_back"] = facts["after_at"] - back
        facts["engines_after"] = _engines(workers)
        facts["failures"] = failures
        facts["answered_after"] = sum(1 for t in answered_after if t > back)
        facts["summary"] = leader.admin("GET", "/api/v1/summary")[1]
        facts["model"] = next(m for m in leader.admin("GET", "/api/v1/models")[1] if m["name"] == MODEL)
        facts["serving_lines"] = [sum(1 for line in w.lines if f"{MODEL} serving on" in line) for w in workers]
        # An adopted replica restarted in place comes back under a new id, and the old one is gone.
        old = facts["after"][0]["id"]
        status, body = leader.admin("POST", "/api/v1/restart", {"replicas": [old], "in_place": True})
        assert status == 202, body
        wait_until(
            lambda: (
                old not in {r["id"] for r in replicas(leader, MODEL)}
                and [r["state"] for r in replicas(leader, MODEL)] == ["ready", "ready"]
            ),
            60,
            "the in-place restart",
        )
        facts["restarted"] = (old, replicas(leader, MODEL))
        facts["leader_log"] = leader.process.output
        facts["workers"] = workers
        yield facts
    finally:
        for worker in workers:
            worker.stop()
        leader.process.stop()
        remove_home(root)


def test_the_same_replicas_are_listed_after_the_restart(restart):
    assert _shape(restart["after"]) == _shape(restart["before"])
    assert {s["node"] for r in restart["after"] for s in r["shards"]} == {"n1", "n2"}
    assert all(r["state"] == "ready" and r["shards"][0]["gpus"] == [0] for r in restart["after"])
    assert "adopted replica" in restart["leader_log"]


def test_their_age_is_the_engines_not_the_leaders(restart):
    # Older than the whole span since before the stop: an age counted from the restart would lack the downtime.
    span = restart["after_at"] - restart["before_at"]
    assert span - restart["since_back"] > 2
    for replica in restart["after"]:
        assert replica["age_seconds"] >= int(span) - 1, (replica, span)


def test_no_engine_was_started_again(restart):
    assert restart["engines_after"] == restart["engines_before"]
    assert all(len(pids) == 1 for pids in restart["engines_before"])
    assert restart["serving_lines"] == [1, 1], [w.output for w in restart["workers"]]


def test_no_request_failed_once_the_leader_was_back(restart):
    assert restart["failures"] == []
    assert restart["answered_after"] >= 20


def test_an_adopted_replica_restarted_in_place_comes_back_under_a_new_id(restart):
    old, listed = restart["restarted"]
    before = {r["id"] for r in restart["before"]}
    now = {r["id"] for r in listed}
    assert len(now) == 2 and old not in now
    assert now - before != set() and before - {old} <= now  # one new id; the other replica untouched


def test_the_adopted_replicas_hold_their_gpus_and_count_as_the_model_s(restart):
    assert restart["summary"]["gpus"] == [{"class": "A10G", "total": 2, "used": 2, "unhealthy": 0}]
    model = restart["model"]
    assert (model.get("ready_replicas"), model.get("desired_replicas")) == (2, 2), model
