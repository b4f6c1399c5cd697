"""``/admin/v1`` and ``/loadz`` as a manager uses them against a live leader with simulator workers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from starlette.routing import Route

from bench.ports import free_port
from opod.contract import adminapi
from opod.contract.features import FEATURE_KEYS, frozen_routes
from opod.leader.leader import Leader as OpodLeader
from opod.leader.leader import LeaderSettings
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, clean_env, http, opod_cli, wait_until

MODEL = "sim-chat"


async def test_every_frozen_route_is_served_by_the_real_app(tmp_path: Path) -> None:
    leader = OpodLeader.open(LeaderSettings(home=tmp_path, default_models=False))
    try:
        app = leader.public_app()
        served = set()
        for route in app.app.routes:
            if isinstance(route, Route) or hasattr(route, "methods"):
                for method in route.methods or ():
                    served.add((method, route.path))
        missing = [(r.method, r.path) for r in frozen_routes() if (r.method, r.path) not in served]
        assert missing == [], f"frozen routes not served: {missing}"
    finally:
        await leader.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("adminv1")
    probe_port = free_port()
    leader = Leader(root / "leader", probe_port=probe_port)
    token = leader.node_token()
    workers = []
    for name in ("n_a", "n_b"):
        home = root / name
        workers.append(
            OpodProcess(
                ["join", leader.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{free_port()}"],
                home,
                env=clean_env(home, OPOD_NODE_ID=name),
            )
        )
    for worker in workers:
        worker.wait_for_line("registered with", timeout=30)
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim", "--no-load").returncode == 0
    status, body = admin(leader, "POST", f"/admin/v1/models/{MODEL}/load", {"node": "n_a"})
    assert status == 202, body
    leader.wait_served(MODEL)
    yield leader
    for worker in workers:
        worker.stop()
    leader.stop()


def admin(leader: Leader, method: str, path: str, body: object | None = None, key: str | None = None):
    status, _, parsed = http(method, leader.url + path, body, key=leader.key if key is None else key)
    return status, parsed


def test_version_and_capabilities(fleet: Leader) -> None:
    status, body = admin(fleet, "GET", "/admin/v1/version")
    version = adminapi.Version.from_wire(body)
    assert status == 200 and version.contract == "v1" and version.version
    caps = adminapi.Capabilities.from_wire(admin(fleet, "GET", "/admin/v1/capabilities")[1])
    assert caps.routes == frozen_routes()
    assert set(caps.features) <= set(FEATURE_KEYS) and all(caps.features.values())
    assert caps.features.get("usage_stream") and caps.features.get("loadz") and not caps.features.get("mtls")
    assert {e.id for e in caps.engines} == {"llamacpp", "ollama", "sglang", "sim", "vllm"}


def test_admin_routes_need_the_admin_key(fleet: Leader) -> None:
    status, body = admin(fleet, "GET", "/admin/v1/nodes", key="")
    assert status == 401 and "admin key" in body["error"]["message"]
    created = opod_cli(fleet, "token", "create").stdout.strip()
    status, body = admin(fleet, "GET", "/admin/v1/nodes", key=created)
    assert status == 401, "an API key is not an admin key"


def test_loadz_has_every_field_from_live_samples(fleet: Leader) -> None:
    for _ in range(5):
        http(
            "POST",
            fleet.url + "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            key=fleet.key,
        )
    status, _, body = http("GET", fleet.url + "/loadz")
    assert status == 200
    load = adminapi.Load.from_wire(body)
    assert "kv_busy_workers" in body and load.workers == 1 and load.rpm_1m >= 5
    assert load.ts >= int(time.time()) - 5 and load.last_request_unix >= int(time.time()) - 60
    wait_until(
        lambda: adminapi.Load.from_wire(http("GET", fleet.url + "/loadz")[2]).reporting == 1, 15, "a load sample"
    )
    # The simulator publishes KV-cache events, so the leader's block index reports its size.
    index = wait_until(
        lambda: adminapi.Load.from_wire(http("GET", fleet.url + "/loadz")[2]).prefix_index, 10, "the prefix index"
    )
    assert index.workers_reporting >= 1 and index.blocks > 0


def test_probe_requests_are_counted_nowhere(fleet: Leader) -> None:
    before = adminapi.Load.from_wire(http("GET", fleet.url + "/loadz")[2]).rpm_1m
    import urllib.request

    for _ in range(5):
        request = urllib.request.Request(
            fleet.url + "/v1/chat/completions",
            method="POST",
            data=b'{"model": "sim-chat", "messages": [{"role": "user", "content": "x"}]}',
            headers={"Authorization": f"Bearer {fleet.key}", "Content-Type": "application/json", "X-Opod-Probe": "1"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    assert adminapi.Load.from_wire(http("GET", fleet.url + "/loadz")[2]).rpm_1m == before


def test_the_probe_listener_serves_probes_and_nothing_else(fleet: Leader) -> None:
    base = f"http://127.0.0.1:{fleet.probe_port}"
    assert http("GET", base + "/loadz")[0] == 200
    assert http("GET", base + "/healthz")[0] == 200
    assert http("GET", base + "/admin/v1/version", key=fleet.key)[0] == 404
    assert http("GET", base + "/v1/models", key=fleet.key)[0] == 404


def test_nodes_drain_and_undrain_change_routing(fleet: Leader) -> None:
    status, nodes = admin(fleet, "GET", "/admin/v1/nodes")
    assert status == 200 and {n["id"] for n in nodes} >= {"n_a", "n_b"}
    node_a = next(n for n in nodes if n["id"] == "n_a")
    assert node_a["state"] == "ready" and MODEL in node_a["loaded_models"] and node_a["hardware"]["Engine"] == "sim"
    assert admin(fleet, "POST", "/admin/v1/nodes/n_a/drain")[1] == {"id": "n_a", "drained": True}
    status, _, body = http(
        "POST",
        fleet.url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        key=fleet.key,
    )
    assert status == 503, "the only holder is drained"
    assert admin(fleet, "POST", "/admin/v1/nodes/n_a/undrain")[0] == 200
    assert (
        http(
            "POST",
            fleet.url + "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
            key=fleet.key,
        )[0]
        == 200
    )
    assert admin(fleet, "POST", "/admin/v1/nodes/nope/drain")[0] == 404


def test_sleep_and_resume_pass_the_workers_answer_through(fleet: Leader) -> None:
    status, body = admin(fleet, "POST", "/admin/v1/nodes/n_a/sleep")
    assert status == 200 and body["status"] == "sleeping"
    status, body = admin(fleet, "POST", "/admin/v1/nodes/n_a/resume")
    assert status == 200 and body["status"] == "resumed"


def test_move_loads_on_the_target_before_unloading_the_source(fleet: Leader) -> None:
    status, body = admin(fleet, "POST", f"/admin/v1/models/{MODEL}/move", {"from": "n_a", "to": "n_b"})
    assert status == 202 and body["status"] == "moving", body
    wait_until(
        lambda: [m["workers"] for m in admin(fleet, "GET", "/admin/v1/models")[1] if m["id"] == MODEL] == [["n_b"]],
        30,
        "the model to be on n_b only",
    )
    status, body = admin(fleet, "POST", f"/admin/v1/models/{MODEL}/move", {"from": "n_a", "to": "n_b"})
    assert status == 409 and "does not hold" in body["error"]["message"]


def test_healthcheck_probes_every_worker(fleet: Leader) -> None:
    status, body = admin(fleet, "POST", "/admin/v1/healthcheck")
    assert status == 200 and body["healthy"] and {n["id"] for n in body["nodes"]} >= {"n_a", "n_b"}


def test_adapters_answer_honestly_when_the_engine_was_started_without_lora(fleet: Leader) -> None:
    status, body = admin(fleet, "POST", "/admin/v1/adapters", {"base": MODEL, "name": "support", "source": "x/y"})
    assert status == 501 and body["results"][0]["status"] == 501
    assert "start it with LoRA on (the plan flag max_lora_rank, or OPOD_ADAPTERS)" in body["results"][0]["answer"]


def test_bad_bodies_name_the_field(fleet: Leader) -> None:
    status, body = admin(fleet, "POST", f"/admin/v1/models/{MODEL}/move", {"to": 7})
    assert status == 400 and "to" in body["error"]["message"]
    status, body = admin(fleet, "GET", "/admin/v1/usage/stream?after=-1")
    assert status == 400 and "after" in body["error"]["message"]
