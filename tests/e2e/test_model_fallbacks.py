"""A model's fallbacks set through the management API: the rules a list keeps, and overflow when every slot is taken."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest

from opod.contract import adminapi
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import sim_worker, wait_until

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
    status, _ = _with_every_slot_taken(fleet, lambda: chat(fleet, BUSY))
    assert status == 503, "with no fallback, a request finding no slot is shed"

    assert put(fleet, BUSY, [SPARE])[0] == 200
    status, headers = _with_every_slot_taken(fleet, lambda: chat(fleet, BUSY))
    assert status == 200 and headers.get("x-opod-fallback") == SPARE, headers
    status, headers = chat(fleet, BUSY)
    assert status == 200 and "x-opod-fallback" not in headers, "with its slot free, the model answers itself"


class _Holder:
    """A long streamed chat of the busy model, sent and left unread: it holds its admission slot until closed."""

    def __init__(self, leader: Leader) -> None:
        where = urlsplit(leader.url)
        self.connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=60)
        body = {"model": BUSY, "messages": [{"role": "user", "content": "hold"}], "max_tokens": 4000, "stream": True}
        headers = {"Authorization": f"Bearer {leader.key}", "Content-Type": "application/json"}
        self.connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)

    def close(self) -> None:
        self.connection.close()  # the client goes away: the leader cancels it and lets its slot go


def _with_every_slot_taken(fleet: Leader, call):
    """``call``'s result, made while long requests of the busy model hold every slot the leader counts for it.

    The slots are the leader's own (its admission pool for the model, sized from what the worker reports), read
    again until they stop changing, so a request arriving meanwhile can neither find one free nor one added."""
    holders: list[_Holder] = []

    def every_slot_held() -> bool:
        size, in_use = _pool(fleet)
        holders.extend(_Holder(fleet) for _ in range(size - len(holders)))
        return 0 < size == len(holders) <= in_use and _pool(fleet)[0] == size

    try:
        wait_until(every_slot_held, 30, "long requests of the busy model to hold every slot of its pool")
        return call()
    finally:
        for holder in holders:
            holder.close()
        wait_until(lambda: _pool(fleet)[1] == 0, 30, "the long requests' slots to be let go")


def _pool(fleet: Leader) -> tuple[int, int]:
    """The busy model's admission pool as the leader holds it: its slots and how many are in use."""

    async def read() -> tuple[int, int]:
        pool = fleet.leader.admission.stats().get(BUSY)
        return (pool.size, pool.in_use) if pool is not None else (0, 0)

    return fleet.call(read())
