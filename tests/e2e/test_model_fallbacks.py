"""A model's fallbacks set through the management API: the rules a list keeps, and overflow when every slot is taken."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from opod.contract import adminapi
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, sim_worker, wait_until

BUSY, SPARE, THIRD = "sim-busy", "sim-spare", "sim-third"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fallbacks")
    policy = root / "policy.json"
    # No waiting for a slot: a request that finds every slot taken is shed at once, or sent down its fallbacks.
    snapshot = adminapi.PolicySnapshot(revision="p1", admission=adminapi.PolicyAdmission(hold_ms=0, max_held=10))
    policy.write_text(snapshot.to_json())
    leader = Leader(root / "leader", env={"OPOD_POLICY_FILE": str(policy)})
    worker = sim_worker(leader, root / "worker", "n_one", OPOD_ENGINE_FLAGS=json.dumps({"max_num_seqs": 1}))
    worker.wait_for_line("registered with", timeout=30)
    for name in (BUSY, SPARE, THIRD):
        status, body = leader.admin("POST", "/api/v1/models", {"name": name, "profiles": [{"engine": "sim"}]})
        assert status == 200, body
    for name in (BUSY, SPARE):
        leader.wait_served(name)
    yield leader
    worker.stop()
    leader.stop()


def chat(leader: Leader, model: str, max_tokens: int = 2) -> tuple[int, dict[str, str]]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})
    request = urllib.request.Request(
        leader.url + "/v1/chat/completions",
        data=body.encode(),
        method="POST",
        headers={"Authorization": f"Bearer {leader.key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        error.read()
        return error.code, {k.lower(): v for k, v in error.headers.items()}


def put(leader: Leader, model: str, fallbacks: list[str]) -> tuple[int, dict]:
    return leader.admin("PUT", f"/api/v1/models/{model}/fallbacks", {"fallbacks": fallbacks})


def test_a_list_is_kept_shown_and_audited(fleet: Leader) -> None:
    status, body = put(fleet, BUSY, [SPARE])
    assert status == 200 and body == {"model": BUSY, "fallbacks": [SPARE]}
    assert fleet.admin("GET", f"/api/v1/models/{BUSY}")[1]["fallbacks"] == [SPARE]
    listed = {m["name"]: m for m in fleet.admin("GET", "/api/v1/models")[1]}
    assert listed[BUSY]["fallbacks"] == [SPARE]
    rows = fleet.admin("GET", "/api/v1/audit?limit=20")[1]
    assert any(r["action"] == "PUT /api/v1/models/{name}/fallbacks" and r["target"] == f"model:{BUSY}" for r in rows), (
        rows
    )


@pytest.mark.parametrize(
    ("fallbacks", "said"),
    [
        ([BUSY], "cannot fall back to itself"),
        (["no-such-model"], "'no-such-model' is not in the catalog"),
        ([SPARE, SPARE], "listed twice"),
        (["east/" + SPARE], "federation peer 'east'"),
        ([""], "fallbacks[0]: empty"),
    ],
)
def test_a_wrong_item_is_refused_by_name_and_nothing_changes(fleet: Leader, fallbacks: list[str], said: str) -> None:
    assert put(fleet, BUSY, [SPARE])[0] == 200
    status, body = put(fleet, BUSY, fallbacks)
    assert status == 400 and said in body["error"], body
    assert fleet.admin("GET", f"/api/v1/models/{BUSY}")[1]["fallbacks"] == [SPARE]


def test_a_cycle_through_other_models_is_refused(fleet: Leader) -> None:
    assert put(fleet, BUSY, [SPARE])[0] == 200
    assert put(fleet, SPARE, [THIRD])[0] == 200
    status, body = put(fleet, THIRD, [BUSY])
    assert status == 400, body
    assert f"{THIRD} → {BUSY} → {SPARE} → {THIRD}" in body["error"], body
    assert "fallbacks" not in fleet.admin("GET", f"/api/v1/models/{THIRD}")[1]
    assert put(fleet, SPARE, [])[0] == 200  # an empty list takes them all away
    assert "fallbacks" not in fleet.admin("GET", f"/api/v1/models/{SPARE}")[1]


def test_a_model_whose_every_slot_is_taken_overflows_to_its_fallback(fleet: Leader) -> None:
    wait_until(lambda: chat(fleet, BUSY)[0] == 200, 20, "the busy model to answer")
    assert put(fleet, BUSY, [])[0] == 200
    status, slow_done = _with_every_slot_taken(fleet, lambda: chat(fleet, BUSY))
    assert status[0] == 503, "with no fallback, a request finding no slot is shed"
    assert set(slow_done) == {200}

    assert put(fleet, BUSY, [SPARE])[0] == 200
    (status, headers), slow_done = _with_every_slot_taken(fleet, lambda: chat(fleet, BUSY))
    assert status == 200 and headers.get("x-opod-fallback") == SPARE, headers
    assert set(slow_done) == {200}
    status, headers = chat(fleet, BUSY)
    assert status == 200 and "x-opod-fallback" not in headers, "with its slot free, the model answers itself"


def _with_every_slot_taken(fleet: Leader, call):
    """``call`` made while long answers of the busy model hold every slot its worker reports; both results."""
    slots = wait_until(lambda: _slots(fleet), 20, "the worker to report its slots")
    slow: list = []
    threads = [threading.Thread(target=lambda: slow.append(chat(fleet, BUSY, max_tokens=120)[0])) for _ in range(slots)]
    for thread in threads:
        thread.start()
    wait_until(lambda: _in_flight(fleet) >= slots, 10, "the long requests to hold every slot")
    got = call()
    for thread in threads:
        thread.join(timeout=60)
    return got, slow


def _slots(fleet: Leader) -> int:
    status, _, body = http("GET", fleet.url + "/admin/v1/nodes", key=fleet.key)
    return next((n["slots"] for n in body if n["id"] == "n_one"), 0) if status == 200 else 0


def _in_flight(fleet: Leader) -> int:
    status, _, body = http("GET", fleet.url + "/loadz", key=fleet.key)
    return int(body.get("inFlight", body.get("in_flight", 0))) if status == 200 and isinstance(body, dict) else 0
