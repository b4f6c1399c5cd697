"""``explain-placement``, measured capacity, ``target`` and ``headroom`` on a real leader with simulator workers.

Two workers declare their GPUs (one with 2 H100, one with an A10G); the models are
defined through the management API with GPU profiles on the simulator engine, and
what an operator reads back is checked: why a model that cannot fit is refused on
each node and by how much, the measurements kept across requests, how many replicas a
throughput needs and whether they fit, how many more fit now and where.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, remove_home, sim_worker, wait_until

H100 = (
    "gpus:\n  - {name: NVIDIA H100 80GB HBM3, class: H100, memory_gb: 80, compute_capability: '9.0', count: 2}\n"
    "labels: {zone: us}\nmemory_gb: 64\n"
)
A10G = "gpus:\n  - {name: NVIDIA A10G, class: A10G, memory_gb: 24, compute_capability: '8.6', count: 1}\nlabels: {zone: eu}\n"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    root = tmp_path_factory.mktemp("capacity")
    up = Leader(root / "leader")
    workers: list[OpodProcess] = []
    try:
        token = up.node_token()
        for node_id, inventory in (("n-h100", H100), ("n-a10g", A10G)):
            home = root / node_id
            home.mkdir()
            (home / "inventory.yaml").write_text(inventory)
            workers.append(sim_worker(up, home, node_id, token=token, OPOD_INVENTORY=str(home / "inventory.yaml")))
        wait_until(lambda: len(up.admin("GET", "/api/v1/nodes")[1] or []) == 2, 60, "both workers to join")
        yield up
    finally:
        for worker in workers:
            worker.stop()
        up.stop()
        remove_home(Path(root))


def add(leader: Leader, definition: dict) -> None:
    status, body = leader.admin("POST", "/api/v1/models", definition)
    assert status == 200, body


def by_node(rejections: list[dict]) -> dict[str, str]:
    return {r["node"]: r["reason"] for r in rejections}


def test_one_that_cannot_fit_is_explained_per_node(leader: Leader) -> None:
    add(
        leader,
        {
            "name": "huge",
            "aliases": ["huge-chat"],
            "profiles": [{"name": "h100x4", "engine": "sim", "gpu_class": "H100", "tp": 4}],
            "scaling": {"min": 1, "max": 1},
        },
    )

    def explained() -> dict | None:
        status, body = leader.admin("GET", "/api/v1/explain-placement?model=huge-chat")
        assert status == 200, body
        return body if body.get("rejections") else None

    body = wait_until(explained, 30, "a placement attempt to be explained")
    assert body["model"] == "huge" and body["placed"] is False
    assert {(r["profile"], r["pool"]) for r in body["rejections"]} == {("h100x4", "H100")}
    assert by_node(body["rejections"]) == {
        "n-h100": "gpus: needs 4 H100 on one node, has 2",
        "n-a10g": "gpu_class: wants H100, node has A10G ×1",
    }
    status, body = leader.admin("GET", "/api/v1/explain-placement?model=no-such-model")
    assert status == 404 and "no-such-model" in body["error"]


def fits_on_the_a10g(leader: Leader) -> None:
    """A model with one replica, holding the A10G node's only card."""
    if leader.admin("GET", "/api/v1/models/fits")[0] == 404:
        add(
            leader,
            {"name": "fits", "profiles": [{"engine": "sim", "gpu_class": "A10G"}], "scaling": {"min": 1, "max": 1}},
        )
    leader.wait_served("fits", timeout=60)


def test_a_model_that_is_placed_has_nothing_to_explain(leader: Leader) -> None:
    fits_on_the_a10g(leader)
    status, body = leader.admin("GET", "/api/v1/explain-placement?model=fits")
    assert status == 200 and body["placed"] is True and body.get("rejections", []) == []


def test_capacity_is_recorded_replaced_and_listed_with_who_measured_it(leader: Leader) -> None:
    add(
        leader,
        {
            "name": "measured",
            "profiles": [
                {"name": "h100", "engine": "sim", "gpu_class": "H100"},
                {"name": "a10g", "engine": "sim", "gpu_class": "A10G"},
            ],
            "scaling": {"min": 0, "max": 4},
        },
    )
    url = f"{leader.admin_url}/api/v1/models/measured/capacity"
    first = {
        "profile": "h100",
        "max_concurrency_at_slo": 16,
        "throughput_tok_per_sec": 900.5,
        "ttft_p99": 250_000_000,
        "tpot_p99": 30_000_000,
        "suggested_target_waiting": 4,
        "suggested_kv_ceiling": 0.8,
        "slo": {"TTFTp99": 500_000_000, "TPOTp99": 50_000_000},
        "target": "http://10.0.0.1:8000",
        "measured_at": "2026-11-30T10:00:00Z",
    }
    status, _, body = http("PUT", url, first, key=leader.key)
    assert status == 200, body
    assert body["model"] == "measured" and body["throughput_tok_per_sec"] == 900.5
    status, _, body = http(
        "PUT", url, {"profile": "a10g", "max_concurrency_at_slo": 4, "throughput_tok_per_sec": 120}, key=leader.key
    )
    assert status == 200 and body["measured_at"]
    # The same profile again replaces the earlier measurement.
    import urllib.request

    request = urllib.request.Request(
        url,
        data=b'{"profile": "h100", "max_concurrency_at_slo": 20, "throughput_tok_per_sec": 1000}',
        method="PUT",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {leader.key}",
            "X-Llmgw-Actor": "bench-bot",
        },
    )
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 200
    status, listed = leader.admin("GET", "/api/v1/capacity")
    assert status == 200
    mine = {m["profile"]: m for m in listed if m["model"] == "measured"}
    assert set(mine) == {"h100", "a10g"}
    assert mine["h100"]["throughput_tok_per_sec"] == 1000 and mine["h100"]["max_concurrency_at_slo"] == 20
    assert mine["h100"]["measured_by"] == "bench-bot" and "ttft_p99" not in mine["h100"]
    assert mine["a10g"]["measured_by"] == "unknown"


def test_capacity_refusals_name_the_field(leader: Leader) -> None:
    add(
        leader,
        {
            "name": "two-ways",
            "profiles": [{"name": "a", "engine": "sim"}, {"name": "b", "engine": "sim"}],
            "scaling": {"min": 0, "max": 1},
        },
    )
    cases = [
        ("two-ways", {"throughput_tok_per_sec": 10}, 400, "profile: two-ways has 2 profiles"),
        ("two-ways", {"profile": "c", "throughput_tok_per_sec": 10}, 400, "profile: two-ways has no profile 'c'"),
        ("two-ways", {"profile": "a"}, 400, "throughput_tok_per_sec"),
        ("two-ways", {"profile": "a", "throughput_tok_per_sec": -1}, 400, "throughput_tok_per_sec: -1"),
        (
            "two-ways",
            {"profile": "a", "throughput_tok_per_sec": 1, "suggested_kv_ceiling": 3},
            400,
            "suggested_kv_ceiling",
        ),
        (
            "two-ways",
            {"model": "other", "profile": "a", "throughput_tok_per_sec": 1},
            400,
            "model: the body names 'other'",
        ),
        ("two-ways", {"profile": "a", "throughput_tok_per_sec": "fast"}, 400, "throughput_tok_per_sec"),
        ("nobody", {"throughput_tok_per_sec": 1}, 404, "'nobody'"),
    ]
    for name, body, code, phrase in cases:
        status, answer = leader.admin("PUT", f"/api/v1/models/{name}/capacity", body)
        assert status == code and phrase in answer["error"], (body, status, answer)
    status, listed = leader.admin("GET", "/api/v1/capacity")
    assert [m for m in listed if m["model"] == "two-ways"] == []  # nothing half-kept


def test_target_counts_replicas_from_measured_capacity_and_says_whether_they_fit(leader: Leader) -> None:
    add(
        leader,
        {
            "name": "sized",
            "profiles": [{"name": "h100", "engine": "sim", "gpu_class": "H100"}],
            "scaling": {"min": 0, "max": 4},
        },
    )
    status, body = leader.admin("GET", "/api/v1/models/sized/target?tokens_per_sec=500")
    assert status == 400 and "PUT /api/v1/models/sized/capacity" in body["error"]
    status, body = leader.admin(
        "PUT", "/api/v1/models/sized/capacity", {"max_concurrency_at_slo": 8, "throughput_tok_per_sec": 200}
    )
    assert status == 200 and body["profile"] == "h100"
    status, body = leader.admin("GET", "/api/v1/models/sized/target?tokens_per_sec=150")
    assert status == 200, body
    assert (body["needed"], body["current"], body["more"], body["room"], body["fits"]) == (1, 0, 1, 1, True)
    assert body["per_replica_tok_per_sec"] == 200 and body["profile"] == "h100" and body["tok_per_sec"] == 150
    # Two replicas are needed; a worker runs one per model and only one worker has H100s.
    status, body = leader.admin("GET", "/api/v1/models/sized/target?tokens_per_sec=500")
    assert (body["needed"], body["more"], body["room"], body["fits"]) == (3, 3, 1, False)
    assert "n-a10g: gpu_class: wants H100, node has A10G ×1" in body["blocked"]
    assert any(line.startswith("n-h100: replica: already holds a replica of sized") for line in body["blocked"])
    for bad in ("0", "-5", "nan", "fast"):
        status, body = leader.admin("GET", f"/api/v1/models/sized/target?tokens_per_sec={bad}")
        assert status == 400 and "tokens_per_sec" in body["error"], (bad, body)


def test_headroom_says_how_many_more_fit_where_and_what_limits_them(leader: Leader) -> None:
    fits_on_the_a10g(leader)
    add(
        leader,
        {
            "name": "roomy",
            "profiles": [{"name": "any-gpu", "engine": "sim", "gpu": {"min_memory_gb": 20}}],
            "scaling": {"min": 0, "max": 4},
        },
    )
    status, body = leader.admin("GET", "/api/v1/models/roomy/headroom")
    assert status == 200, body
    assert body["model"] == "roomy" and body["current"] == 0 and body["more"] == 1
    assert body["nodes"] == [["n-h100"]] and body["limited"] is False
    assert body["tok_per_sec"] == 0 and body["by_preempting"] == 0 and "preempts" not in body
    # The A10G is held by a standard model, which roomy (opportunistic: on demand) may not preempt.
    assert sorted(body["blocked"]) == [
        "n-a10g: gpus: needs 1 free A10G, has 0 free (1 held by fits)",
        "n-h100: replica: already holds a replica of roomy (a worker runs one engine per model)",
    ]
    status, body = leader.admin("PUT", "/api/v1/models/roomy/capacity", {"throughput_tok_per_sec": 75})
    assert status == 200
    status, body = leader.admin("GET", "/api/v1/models/roomy/headroom?limit=1")
    assert body["more"] == 1 and body["limited"] is True and "blocked" not in body and body["tok_per_sec"] == 75
    status, body = leader.admin("GET", "/api/v1/models/roomy/headroom?limit=500")
    assert body["more"] == 1 and body["limited"] is False  # past 64 is 16
    status, body = leader.admin("GET", "/api/v1/models/roomy/headroom?limit=0")
    assert status == 400 and "limit" in body["error"]
    status, body = leader.admin("GET", "/api/v1/models/nobody/headroom")
    assert status == 404


def test_a_model_never_attempted_is_explained_from_the_fleet_as_it_is(leader: Leader) -> None:
    add(
        leader,
        {
            "name": "picky",
            "profiles": [{"engine": "sim", "gpu_class": "H100", "node_selector": {"zone": "eu"}}],
            "scaling": {"min": 0, "max": 1},
        },
    )
    status, body = leader.admin("GET", "/api/v1/explain-placement?model=picky")
    assert status == 200 and body["placed"] is False
    assert by_node(body["rejections"]) == {
        "n-h100": "node_selector: wants zone=eu, node has zone=us",
        "n-a10g": "gpu_class: wants H100, node has A10G ×1",
    }


def test_a_critical_model_counts_the_room_it_would_take_from_a_lower_class(leader: Leader) -> None:
    fits_on_the_a10g(leader)
    add(
        leader,
        {
            "name": "vip",
            "class": "critical",
            "profiles": [{"name": "a10g", "engine": "sim", "gpu_class": "A10G"}],
            "scaling": {"min": 0, "max": 2},
        },
    )
    status, body = leader.admin("GET", "/api/v1/models/vip/headroom")
    assert status == 200, body
    assert body["more"] == 0 and body["by_preempting"] == 1 and body["preempts"] == ["fits"]
    assert "n-a10g: gpus: needs 1 free A10G, has 0 free (1 held by fits)" in body["blocked"]
    status, _ = leader.admin(
        "PUT", "/api/v1/models/vip/capacity", {"throughput_tok_per_sec": 50, "max_concurrency_at_slo": 2}
    )
    status, body = leader.admin("GET", "/api/v1/models/vip/target?tokens_per_sec=50")
    assert (body["needed"], body["more"], body["room"], body["fits"], body["preempts"]) == (1, 1, 1, True, ["fits"])
    # Asking changed nothing: fits still serves.
    assert "fits" in leader.served()
