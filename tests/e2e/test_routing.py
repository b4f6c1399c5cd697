"""Routing through a live leader: the routing header, canary revisions, and the fallback chain's rules."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from bench.ports import free_port
from opod.catalog import bundled_dir
from opod.contract import adminapi
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, clean_env, http, opod_cli, usage_rows, wait_until

MAIN, BACKUP = "sim-main", "sim-backup"


def _write(path: Path, snap: adminapi.WireModel) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(snap.to_json())
    os.replace(tmp, path)


def _catalog_entry(home: Path, model_id: str, fallback: list[str] | None = None) -> None:
    """A simulated model in the leader's own catalog (~/.opod/catalog), with a fallback chain."""
    body = yaml.safe_load((bundled_dir() / "qwen2.5-0.5b-gguf.yaml").read_text())
    body.update(
        id=model_id, display_name=model_id, source={"type": "file", "path": "/simulated"}, capabilities=["chat"]
    )
    if fallback:
        body["fallback"] = fallback
    (home / "catalog").mkdir(parents=True, exist_ok=True)
    (home / "catalog" / f"{model_id}.yaml").write_text(yaml.safe_dump(body))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("routing")
    files = root / "files"
    files.mkdir()
    _write(files / "policy.json", adminapi.PolicySnapshot(revision="p0"))
    home = root / "leader"
    _catalog_entry(home, MAIN, fallback=[BACKUP])
    _catalog_entry(home, BACKUP)
    leader = Leader(home, env={"OPOD_POLICY_FILE": str(files / "policy.json")})
    leader.files = files
    token = leader.node_token()
    workers = {}
    for name, revision in (("n_rev7", "7"), ("n_rev8", "8")):
        worker_home = root / name
        workers[name] = OpodProcess(
            ["join", leader.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{free_port()}"],
            worker_home,
            env=clean_env(worker_home, OPOD_NODE_ID=name, OPOD_PLAN_REVISION=revision),
        )
    for worker in workers.values():
        worker.wait_for_line("registered with", timeout=30)
    for model in (MAIN, BACKUP):
        assert opod_cli(leader, "model", "add", model, "--engine", "sim", "--no-load").returncode == 0
    for name in workers:
        assert leader.admin("POST", f"/api/v1/models/{MAIN}/load", {"node": name})[0] == 200
    assert leader.admin("POST", f"/api/v1/models/{BACKUP}/load", {"node": "n_rev7"})[0] == 200
    wait_until(lambda: {MAIN, BACKUP} <= leader.served(), 60, "both models served")
    yield leader, workers
    for worker in workers.values():
        worker.stop()
    leader.stop()


def chat(leader: Leader, model: str = MAIN, request_id: str | None = None) -> tuple[int, dict, dict]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "route me"}], "max_tokens": 2}).encode()
    headers = {"Authorization": f"Bearer {leader.key}", "Content-Type": "application/json"}
    if request_id:
        headers["X-Request-Id"] = request_id
    request = urllib.request.Request(leader.url + "/v1/chat/completions", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, json.loads(error.read())


def test_every_answer_says_which_worker_and_why(fleet) -> None:
    leader, _ = fleet
    status, headers, _ = chat(leader)
    assert status == 200
    route = dict(part.split("=", 1) for part in headers["x-opod-route"].split("; "))
    assert route["worker"] in ("n_rev7", "n_rev8") and route["reason"] in ("load", "prefix", "pin", "only")
    assert {"load", "queue"} <= set(route)

    kept = wait_until(lambda: _usage_row(leader, headers["x-request-id"]), 5, "the usage row")
    assert kept.route["worker"] == route["worker"], "the same record is kept with the usage row"


def test_a_ten_percent_canary_gets_about_ten_percent(fleet) -> None:
    leader, _ = fleet
    policy = adminapi.PolicySnapshot(
        revision="canary",
        routing=adminapi.PolicyRouting(
            revisions=[adminapi.RevisionWeight(revision=7, weight=9), adminapi.RevisionWeight(revision=8, weight=1)]
        ),
    )
    _write(leader.files / "policy.json", policy)
    wait_until(lambda: "canary=" in chat(leader)[1].get("x-opod-route", ""), 5, "the policy to apply")
    workers = Counter(chat(leader)[1]["x-opod-worker"] for _ in range(600))
    assert abs(workers["n_rev8"] / 600 - 0.10) <= 0.04, workers
    _, headers, _ = chat(leader, request_id="fixed-id-1")
    again = [chat(leader, request_id="fixed-id-1")[1]["x-opod-worker"] for _ in range(5)]
    assert set(again) == {headers["x-opod-worker"]}, "the group is fixed by the request, so a retry stays in it"
    _write(leader.files / "policy.json", adminapi.PolicySnapshot(revision="p1"))


def test_catalog_fallback_then_the_policys_url_and_never_on_a_4xx(fleet, tmp_path: Path) -> None:
    leader, _ = fleet
    # Take the main model away from every worker: n_rev8 is drained, n_rev7 unloads it (and keeps the backup).
    assert http("POST", leader.url + "/admin/v1/nodes/n_rev8/drain", key=leader.key)[0] == 200
    assert leader.admin("POST", f"/api/v1/models/{MAIN}/unload", {"node": "n_rev7"})[0] == 200
    wait_until(lambda: chat(leader)[1].get("x-opod-fallback") == BACKUP, 30, "the catalog fallback to answer")
    status, headers, body = chat(leader)
    assert status == 200 and headers["x-opod-fallback"] == BACKUP
    status, _, body = chat(leader, model="no-such")
    assert status == 404, "a 4xx is never sent down the fallback chain"

    port = free_port()
    outside = OpodProcess(
        ["sim", "--port", str(port), "--model", "outside-model", "--time-scale", "0"], tmp_path / "outside"
    )
    try:
        outside.wait_for_line("listening", timeout=30)
        _write(
            leader.files / "policy.json",
            adminapi.PolicySnapshot(
                revision="fb",
                routing=adminapi.PolicyRouting(
                    fallback_url=f"http://127.0.0.1:{port}/v1", fallback_model="outside-model"
                ),
            ),
        )
        assert leader.admin("POST", f"/api/v1/models/{BACKUP}/unload", {"node": "n_rev7"})[0] == 200
        wait_until(
            lambda: chat(leader)[1].get("x-opod-fallback", "").startswith("http://127.0.0.1"),
            30,
            "the policy's fallback URL",
        )
        status, headers, body = chat(leader)
        assert status == 200 and body["model"] == "outside-model"
    finally:
        outside.stop()
        http("POST", leader.url + "/admin/v1/nodes/n_rev8/undrain", key=leader.key)


def test_requests_sharing_a_long_prefix_go_where_it_is_cached(fleet) -> None:
    leader, _ = fleet
    _write(
        leader.files / "policy.json",
        adminapi.PolicySnapshot(
            revision="prefix",
            routing=adminapi.PolicyRouting(prefix_block_weight=1.0, kv_weight=1.0, prefix_affinity=True),
        ),
    )
    system = "You are a support agent for a large hardware store. " * 40
    for name in ("n_rev7", "n_rev8"):
        http("POST", leader.url + f"/admin/v1/nodes/{name}/undrain", key=leader.key)
    assert leader.admin("POST", f"/api/v1/models/{MAIN}/load", {"node": "n_rev7"})[0] == 200
    assert leader.admin("POST", f"/api/v1/models/{MAIN}/load", {"node": "n_rev8"})[0] == 200
    wait_until(
        lambda: (
            len(
                [
                    n
                    for n in http("GET", leader.url + "/admin/v1/nodes", key=leader.key)[2]
                    if MAIN in n["loaded_models"]
                ]
            )
            == 2
        ),
        30,
        "both workers to hold the model",
    )

    def ask(user: str) -> dict:
        body = {
            "model": MAIN,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 2,
        }
        status, headers, _ = http("POST", leader.url + "/v1/chat/completions", body, key=leader.key)
        assert status == 200
        return dict(part.split("=", 1) for part in headers["x-opod-route"].split("; "))

    first = ask("Where are the hammers?")
    second = ask("Do you sell nails?")
    assert second["worker"] == first["worker"], (
        "before the cache events arrive, the sticky pin keeps the prefix together"
    )
    wait_until(lambda: ask("And screws?")["reason"] == "prefix", 10, "the cached prefix to steer the request")
    routes = [ask(f"Question number {i}?") for i in range(8)]
    assert {r["worker"] for r in routes} == {first["worker"]}, routes
    assert all(r["reason"] == "prefix" and int(r["blocks"].split("/")[0]) >= 20 for r in routes), routes


def test_every_answer_says_where_its_time_went(fleet) -> None:
    leader, _ = fleet
    started = time.perf_counter()
    status, headers, _ = chat(leader)
    total_ms = (time.perf_counter() - started) * 1000
    assert status == 200
    timing = {
        name: float(dur.removeprefix("dur="))
        for name, dur in (part.strip().split(";") for part in headers["server-timing"].split(","))
    }
    assert set(timing) == {"opod", "upstream"}
    # The simulated engine takes at least its 20 ms to a first token; opod's own share is a small part.
    assert timing["upstream"] >= 20 and 0 < timing["opod"] < timing["upstream"]
    assert timing["opod"] + timing["upstream"] <= total_ms


def _usage_row(leader: Leader, request_id: str) -> adminapi.UsageData | None:
    return next((row.data for row in usage_rows(leader) if row.data.request_id == request_id), None)


def test_a_client_that_leaves_mid_stream_is_recorded_with_the_tokens_it_got(fleet) -> None:
    leader, _ = fleet
    request_id = f"leaves-{time.time_ns()}"
    body = json.dumps(
        {
            "model": MAIN,
            "messages": [{"role": "user", "content": "a long answer, please"}],
            "max_tokens": 1000,
            "stream": True,
        }
    ).encode()
    host, port = leader.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: opod\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {leader.key}\r\nX-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        seen = b""
        while (got := seen.count(b'"content":"') - seen.count(b'"content":""')) < 3:
            seen += conn.recv(65536)
        assert seen.startswith(b"HTTP/1.1 200 ")
    left = time.monotonic()
    # 1,000 tokens at the simulator's 8 ms each would take 8 s: the row comes before, marked as cancelled. It comes
    # in a fraction of a second here; the bound leaves room for a CI machine busy with other tests (the ledger's
    # writer commits below the event loop's priority), and stays below the answer's own end.
    wait_until(lambda: _usage_row(leader, request_id) is not None, 7, "the usage row of the request whose client left")
    assert time.monotonic() - left < 7
    row = _usage_row(leader, request_id)
    assert row.outcome == "cancelled"
    # At least the tokens the client read; maybe a few more that were on their way when it left.
    assert got <= row.completion_tokens < 1000
