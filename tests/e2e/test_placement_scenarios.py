"""Placement scenarios: a leader, ``opod join`` simulator workers with declared GPUs, the openai client.

What an operator would notice: a model that needs tensor parallel across two
nodes gets one replica with a shard on each (rank 0 serves), and a model that
cannot fit beside it is explained node by node; a model's weekly schedule
window decides whether it has a replica now, and ``prewarm`` starts one before
its window opens.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tests.support.gpu_fleet import add, declared_fleet, replicas
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import wait_until

openai = pytest.importorskip("openai")

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
HOUR_NS = 3600 * 1_000_000_000
TWO_NODES = {"engine": "sim", "gpu_class": "A10G", "tp": 2, "gpus_per_node": 1, "nodes": 2}


@pytest.fixture
def fleet(tmp_path):
    with declared_fleet(tmp_path) as made:
        yield made


def model_view(leader: Leader, name: str) -> dict:
    status, models = leader.admin("GET", "/api/v1/models")
    assert status == 200, models
    return next(m for m in models if m["name"] == name)


def explain(leader: Leader, name: str) -> dict:
    status, body = leader.admin("GET", f"/api/v1/explain-placement?model={name}")
    assert status == 200, body
    return body


def chat(leader: Leader, model: str) -> str | None:
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=60)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return answer.choices[0].message.content


def test_a_model_needing_tensor_parallel_across_two_nodes_spans_both_and_a_third_copy_is_explained(fleet):
    leader, join = fleet
    join("n1")
    join("n2")
    add(leader, {"name": "wide", "profiles": [TWO_NODES], "scaling": {"min": 1, "max": 1}})
    leader.wait_served("wide", timeout=60)
    # Served once a worker's heartbeat says so; the replica reads ready once the reconciler has seen it, a tick later.
    wait_until(lambda: [r["state"] for r in replicas(leader, "wide")] == ["ready"], 30, "the replica to read ready")
    (replica,) = replicas(leader, "wide")
    shards = sorted(replica["shards"], key=lambda s: s["rank"])
    assert [s["rank"] for s in shards] == [0, 1]
    assert sorted(s["node"] for s in shards) == ["n1", "n2"]
    assert [s["gpus"] for s in shards] == [[0], [0]]
    # Rank 0's simulator answers for the whole replica; the follower is no second copy to route to.
    assert all(chat(leader, "wide") is not None for _ in range(10))
    view = model_view(leader, "wide")
    assert view["ready_replicas"] == 1 and view["desired_replicas"] == 1, view

    # Another model of the same shape: both GPUs are the first one's, and each node says so.
    add(leader, {"name": "wide-too", "profiles": [TWO_NODES], "scaling": {"min": 1, "max": 1}})
    wait_until(lambda: model_view(leader, "wide-too").get("unplaceable"), 30, "wide-too to be reported unplaceable")
    why = explain(leader, "wide-too")
    assert why["placed"] is False
    by_node = {r["node"]: r["reason"] for r in why["rejections"]}
    assert sorted(by_node) == ["n1", "n2"], why
    for reason in by_node.values():
        assert reason.startswith("gpus: needs 1 free A10G, has 0 free (1 held by wide)"), why
    assert replicas(leader, "wide-too") == []

    # A second copy of the first model: the replica it has already holds both nodes.
    status, body = leader.admin("POST", "/api/v1/models/wide/scale", {"min": 2, "max": 2})
    assert status == 200, body
    wait_until(
        lambda: model_view(leader, "wide").get("unplaceable"), 30, "the second copy of wide to be reported unplaceable"
    )
    why = explain(leader, "wide")
    assert why["placed"] is True
    assert sorted(r["node"] for r in why["rejections"]) == ["n1", "n2"], why
    assert all("holds a replica of it already" in r["reason"] for r in why["rejections"]), why
    assert len(replicas(leader, "wide")) == 1 and chat(leader, "wide") is not None  # the first copy serves on


def hhmm(at: datetime) -> str:
    return at.strftime("%H:%M")


def test_a_schedule_window_decides_whether_a_model_has_a_replica_and_prewarm_starts_one_early(fleet):
    leader, join = fleet
    join("n1")
    now = datetime.now()  # the leader reads windows in the same local time (same machine, same TZ)
    today, yesterday, tomorrow = (DAYS[(now.weekday() + shift) % 7] for shift in (0, -1, 1))

    def window(start: timedelta, end: timedelta, days: list[str] | None = None) -> dict:
        out = {"from": hhmm(now + start), "to": hhmm(now + end), "min": 1}
        return out | ({"days": days} if days else {})

    # Yesterday too: around midnight the window runs past it, and such a window belongs to the day it began.
    open_now = window(timedelta(minutes=-10), timedelta(minutes=10), [today, yesterday])
    add(leader, {"name": "office", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "schedule": [open_now]}})
    ended = window(timedelta(hours=-3), timedelta(hours=-1))
    add(leader, {"name": "evening", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "schedule": [ended]}})
    elsewhere = window(timedelta(minutes=-10), timedelta(minutes=10), [tomorrow])
    add(leader, {"name": "weekly", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "schedule": [elsewhere]}})
    soon = window(timedelta(minutes=20), timedelta(minutes=40))
    add(
        leader,
        {
            "name": "morning",
            "profiles": [{"engine": "sim"}],
            "scaling": {"min": 0, "schedule": [soon], "prewarm": HOUR_NS // 2},
        },
    )

    later = window(timedelta(minutes=20), timedelta(minutes=40))
    add(
        leader,
        {
            "name": "later",
            "profiles": [{"engine": "sim"}],
            "scaling": {"min": 0, "schedule": [later], "prewarm": HOUR_NS // 6},
        },
    )

    leader.wait_served("office", "morning", timeout=60)
    assert chat(leader, "office") is not None
    assert [r["shards"][0]["node"] for r in replicas(leader, "office")] == ["n1"]
    assert model_view(leader, "office")["desired_replicas"] == 1
    # 20 minutes before its window, with 30 minutes of prewarm: started already.
    (early,) = replicas(leader, "morning")
    assert early["state"] == "ready" and model_view(leader, "morning")["desired_replicas"] == 1

    for name in ("evening", "weekly", "later"):  # "later": 20 minutes before its window, with 10 of prewarm
        assert replicas(leader, name) == [], name
        view = model_view(leader, name)
        assert view["desired_replicas"] == 0 and view.get("ready_replicas", 0) == 0, view
    assert not {"evening", "weekly", "later"} & leader.served()
