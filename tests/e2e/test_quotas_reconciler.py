"""Quotas change what the reconciler places, on a leader with simulator workers declaring GPUs.

Two workers with two A10G each (4 GPUs), one leader for the module. A team at its
GPU limit gets no more replicas, and ``explain-placement`` says which quota;
raising the limit places them. A guarantee keeps GPUs free from a shared
model while its own team's model takes them; removing it lets the shared model in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gpu_fleet import add, replicas
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, remove_home, sim_worker, wait_until

TWO_A10G = "gpus:\n  - {name: NVIDIA A10G, class: A10G, memory_gb: 24, compute_capability: '8.6', count: 2}\n"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    root: Path = tmp_path_factory.mktemp("quotas")
    up = Leader(root / "leader")
    token = up.node_token()
    workers = []
    try:
        for node_id in ("n1", "n2"):
            home = root / node_id
            home.mkdir()
            (home / "inventory.yaml").write_text(TWO_A10G)
            workers.append(sim_worker(up, home, node_id, token=token, OPOD_INVENTORY=str(home / "inventory.yaml")))
        wait_until(
            lambda: {n.get("id") for n in (up.admin("GET", "/api/v1/nodes")[1] or [])} >= {"n1", "n2"},
            60,
            "both workers",
        )
        status, org = up.admin("POST", "/api/v1/orgs", {"name": "acme"})
        assert status == 201, org
        for team in ("ml", "web"):
            status, body = up.admin("POST", "/api/v1/teams", {"name": team, "in": "acme"})
            assert status == 201, body
        yield up
    finally:
        for worker in workers:
            worker.stop()
        up.stop()
        remove_home(root)


def put_quota(leader: Leader, body: dict) -> str:
    status, answer = leader.admin("PUT", "/api/v1/quotas", body)
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer["scope"]


def quota_view(leader: Leader, scope: str) -> dict:
    status, views = leader.admin("GET", "/api/v1/quotas")
    assert status == 200 and isinstance(views, list), views
    return next(v for v in views if v["scope"] == scope)


def ready(leader: Leader, model: str) -> int:
    return sum(1 for r in replicas(leader, model) if r["state"] == "ready")


def reasons(leader: Leader, model: str) -> list[str]:
    status, body = leader.admin("GET", f"/api/v1/explain-placement?model={model}")
    assert status == 200 and isinstance(body, dict), body
    return [r["reason"] for r in body.get("rejections", [])]


def remove(leader: Leader, *models: str) -> None:
    for model in models:
        status, body = leader.admin("DELETE", f"/api/v1/models/{model}")
        assert status == 200, body
    wait_until(
        lambda: not any(r["model"] in models for r in leader.admin("GET", "/api/v1/replicas")[1] or []),
        60,
        "the models' replicas to stop",
    )


def gpu_model(name: str, owner: str = "", count: int = 1) -> dict:
    body: dict = {
        "name": name,
        "profiles": [{"engine": "sim", "gpu_class": "A10G"}],
        "scaling": {"min": count, "max": count},
    }
    if owner:
        body["owner"] = owner
    return body


def test_a_team_at_its_gpu_limit_gets_no_more_replicas_until_the_limit_is_raised(leader: Leader) -> None:
    ml = put_quota(leader, {"scope": "team:acme/ml", "limit": {"gpus": 1}})
    assert ml.startswith("team:") and "acme" not in ml  # answered by ID, whatever name it was asked by
    view = quota_view(leader, ml)
    assert view["name"] == "acme / ml" and view["limit"] == {"gpus": 1} and "guarantee" not in view
    try:
        add(leader, gpu_model("ml-chat", owner="team:acme/ml", count=2))
        wait_until(lambda: ready(leader, "ml-chat") == 1, 60, "the one replica the limit allows")
        wait_until(
            lambda: any(r.startswith(f"quota: {ml} (acme / ml) holds 1 of 1 GPUs") for r in reasons(leader, "ml-chat")),
            30,
            "explain-placement to name the quota",
        )
        assert len(replicas(leader, "ml-chat")) == 1
        assert quota_view(leader, ml)["holds"] == {"GPUs": 1, "CPUCores": 0, "MemoryGB": 0}

        def quota_hits() -> list[dict]:
            status, _, page = http("GET", leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=leader.key)
            assert status == 200 and isinstance(page, dict)
            return [e for e in page.get("events", []) if e.get("type") == "quota.hit"]

        hits = wait_until(quota_hits, 15, "the quota.hit event on the stream")  # committed by the ledger's writer
        assert hits[0].get("subject") == ml and len(hits) == 1  # once, not every round

        put_quota(leader, {"scope": ml, "limit": {"gpus": 2}})
        wait_until(lambda: ready(leader, "ml-chat") == 2, 60, "the second replica once the limit is raised")
        assert quota_view(leader, ml)["holds"]["GPUs"] == 2
    finally:
        remove(leader, "ml-chat")
        status, body = leader.admin("DELETE", f"/api/v1/quotas/{ml}")
        assert status == 200 and body == {"removed": ml}, body


def test_a_guarantee_keeps_gpus_free_from_a_shared_model_and_not_from_its_own_team(leader: Leader) -> None:
    web = put_quota(leader, {"scope": "team:acme/web", "guarantee": {"gpus": 3}})
    try:
        # Another team's model holds one GPU: 3 are free, all kept for web's guarantee.
        add(leader, gpu_model("ml-small", owner="team:acme/ml"))
        wait_until(lambda: ready(leader, "ml-small") == 1, 60, "ml's replica (it leaves 3 free)")
        add(leader, gpu_model("open-chat"))
        wait_until(
            lambda: any("holds 0 of its guarantee of 3 GPUs" in r for r in reasons(leader, "open-chat")),
            30,
            "the shared model to be refused for the guarantee",
        )
        assert replicas(leader, "open-chat") == []
        add(leader, gpu_model("web-chat", owner="team:acme/web", count=2))
        wait_until(lambda: ready(leader, "web-chat") == 2, 60, "web's own model to take its guaranteed GPUs")
        assert replicas(leader, "open-chat") == [] and quota_view(leader, web)["holds"]["GPUs"] == 2

        status, body = leader.admin("DELETE", "/api/v1/quotas/team:acme/web")
        assert status == 200 and body == {"removed": web}, body
        wait_until(lambda: ready(leader, "open-chat") == 1, 60, "the shared model once the guarantee is gone")
    finally:
        remove(leader, "ml-small", "open-chat", "web-chat")
        leader.admin("DELETE", f"/api/v1/quotas/{web}")


def test_bad_quotas_are_refused_whole_with_the_field_named(leader: Leader) -> None:
    status, body = leader.admin("PUT", "/api/v1/quotas", {"scope": "team:acme/nope", "limit": {"gpus": 1}})
    assert status == 404 and "no team" in str(body), body
    status, body = leader.admin(
        "PUT", "/api/v1/quotas", {"scope": "team:acme/ml", "guarantee": {"gpus": 4}, "limit": {"gpus": 2}}
    )
    assert status == 400 and "guarantee.gpus: 4 is above limit.gpus 2" in str(body), body
    status, body = leader.admin("PUT", "/api/v1/quotas", {"scope": "team:acme/ml", "limit": {"gpus": -1}})
    assert status == 400 and "limit.gpus" in str(body), body
    status, body = leader.admin("PUT", "/api/v1/quotas", {"scope": "user:someone", "limit": {"gpus": 1}})
    assert status == 400 and "scope" in str(body), body
    status, body = leader.admin("DELETE", "/api/v1/quotas/team:acme/ml")
    assert status == 404 and "no quota" in str(body), body
    status, views = leader.admin("GET", "/api/v1/quotas")
    assert status == 200 and views == []
