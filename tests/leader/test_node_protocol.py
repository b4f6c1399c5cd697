"""The node protocol as a worker speaks it to a live leader, and as a leader speaks it to a live worker.

Every call is signed with ``X-Opod-Auth``; a forged, skewed or replayed
signature is refused with a reason, a bearer token is never accepted, and a
heartbeat's ``loaded_models`` keeps ``null`` ("no report") apart from ``[]``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.ports import free_port
from opod.contract import nodeapi
from opod.contract.nodeauth import HEADER, sign
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, clean_env, http, opod_cli, wait_until

NODE = "n_fake-1"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    leader = Leader(tmp_path_factory.mktemp("proto") / "home")
    yield leader
    leader.stop()


@pytest.fixture(scope="module")
def token(leader: Leader) -> str:
    return leader.node_token()


class FakeWorker:
    """The test's worker: signs with the contract's helpers, one fresh nonce per call."""

    def __init__(self, leader: Leader, token: str, node_id: str = NODE) -> None:
        import secrets

        self.leader, self.token, self.node_id = leader, token, node_id
        self.counter = 0
        self.boot = secrets.token_hex(4)  # a new sender boot: its counters start again

    def header(self, path: str, *, now: float | None = None, nonce: str | None = None) -> str:
        self.counter += 1
        return sign(
            self.node_id,
            self.token,
            "POST",
            path,
            now=now,
            nonce=f"{self.boot}.{self.counter}" if nonce is None else nonce,
        )

    def post(self, path: str, body: nodeapi.WireModel | bytes, header: str | None = None, extra: dict | None = None):
        import urllib.request

        data = body if isinstance(body, bytes) else body.to_json().encode()
        request = urllib.request.Request(self.leader.url + path, data=data, method="POST")
        request.add_header("Content-Type", "application/json")
        if header is not None:
            request.add_header(HEADER, header)
        for k, v in (extra or {}).items():
            request.add_header(k, v)
        import urllib.error

        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def register(self, **kw):
        req = nodeapi.RegisterRequest(
            id=self.node_id,
            hostname="fake",
            os="linux",
            arch="amd64",
            ram_gb=8,
            address="127.0.0.1:9",
            hardware_json=nodeapi.encode_hardware(
                kw.get("caps") or nodeapi.Capabilities(hostname="fake", engine="sim")
            ),
            boot_id="boot-1",
        )
        return self.post(nodeapi.PATH_REGISTER, req, kw.get("header", self.header(nodeapi.PATH_REGISTER)))

    def heartbeat(self, hb: nodeapi.Heartbeat, header: str | None = None):
        return self.post(nodeapi.PATH_HEARTBEAT, hb, header or self.header(nodeapi.PATH_HEARTBEAT))


def _models_of(leader: Leader, node_id: str) -> list[str] | None:
    # The management API's NodeView has no models; the contract's /admin/v1/nodes lists them.
    status, _, body = http("GET", leader.url + "/admin/v1/nodes", key=leader.key)
    return next((n["loaded_models"] for n in body if n["id"] == node_id), None)


def test_register_with_a_token_then_heartbeat(leader: Leader, token: str) -> None:
    worker = FakeWorker(leader, token)
    status, body = worker.register()
    assert (status, body) == (200, {"status": "registered", "id": NODE})
    status, body = worker.heartbeat(nodeapi.Heartbeat(id=NODE, loaded_models=[], boot_id="boot-1"))
    assert (status, body) == (200, {"status": "ok"})


def test_null_loaded_models_never_clears_what_was_reported(leader: Leader, token: str) -> None:
    worker = FakeWorker(leader, token)
    worker.register()
    assert worker.heartbeat(nodeapi.Heartbeat(id=NODE, loaded_models=["m1", "m2"], boot_id="boot-1"))[0] == 200
    assert _models_of(leader, NODE) == ["m1", "m2"]
    assert worker.heartbeat(nodeapi.Heartbeat(id=NODE, loaded_models=None, boot_id="boot-1"))[0] == 200
    assert _models_of(leader, NODE) == ["m1", "m2"]
    assert worker.heartbeat(nodeapi.Heartbeat(id=NODE, loaded_models=[], boot_id="boot-1"))[0] == 200
    assert _models_of(leader, NODE) == []


def test_free_disk_follows_the_heartbeat_and_total_comes_from_registration(leader: Leader, token: str) -> None:
    worker = FakeWorker(leader, token, "n_fake-disk")
    assert (
        worker.register(caps=nodeapi.Capabilities(hostname="fake", engine="sim", disk_free_gb=100, disk_total_gb=500))[
            0
        ]
        == 200
    )

    def disk() -> tuple[int, int]:
        node = next(n for n in leader.admin("GET", "/api/v1/nodes")[1] if n["id"] == "n_fake-disk")
        return node["disk_free_gb"], node["disk_total_gb"]

    assert disk() == (100, 500)
    assert (
        worker.heartbeat(nodeapi.Heartbeat(id="n_fake-disk", loaded_models=[], boot_id="b", disk_free_gb=42))[0] == 200
    )
    assert disk() == (42, 500)
    assert worker.heartbeat(nodeapi.Heartbeat(id="n_fake-disk", loaded_models=[], boot_id="b"))[0] == 200
    assert disk() == (42, 500), "a heartbeat that does not say keeps the last figure"


def test_a_workers_gpus_show_in_the_node_list_and_the_cli(leader: Leader, token: str) -> None:
    h200 = nodeapi.GPU(name="NVIDIA H200", vram_gb=139)
    worker = FakeWorker(leader, token, "n_fake-gpu")
    assert (
        worker.register(caps=nodeapi.Capabilities(hostname="gpu-box", engine="llamacpp", gpus=[h200, h200]))[0] == 200
    )
    FakeWorker(leader, token, "n_fake-cpu").register()
    nodes = {n["id"]: n for n in leader.admin("GET", "/api/v1/nodes")[1]}
    gpu, cpu = nodes["n_fake-gpu"], nodes["n_fake-cpu"]
    assert (gpu["gpu_total"], gpu["gpu_classes"]) == (2, ["NVIDIA H200"])
    assert gpu["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "label": "1",
        "class": "NVIDIA H200",
        "card": 1,
        "memory_total_mb": 139 * 1024,
    }
    assert (cpu["gpu_total"], cpu.get("gpus"), cpu.get("gpu_classes")) == (0, None, None)
    listed = opod_cli(leader, "node", "ls")
    assert listed.returncode == 0
    line = next(line for line in listed.stdout.splitlines() if line.startswith("n_fake-gpu"))
    assert "2× NVIDIA H200 (139 GiB, 2 free)" in line


def test_a_crash_looping_engine_takes_the_worker_out_everywhere(leader: Leader, token: str) -> None:
    worker = FakeWorker(leader, token, "n_fake-loop")
    worker.register()
    looping = nodeapi.EngineState(state="crash-looping", restarts=4, detail="exit status 1: out of memory")
    worker.heartbeat(nodeapi.Heartbeat(id="n_fake-loop", loaded_models=["m9"], boot_id="b", engine=looping))
    status, body = leader.admin("GET", "/api/v1/nodes")
    node = next(n for n in body if n["id"] == "n_fake-loop")
    assert (
        node["state"] == "ready"
        and "takes no requests: engine crash-looping: exit status 1: out of memory" in node["warnings"]
    )
    status, _, models = http("GET", leader.url + "/v1/models", key=leader.key)
    assert "m9" not in {m["id"] for m in models["data"]}
    worker.heartbeat(
        nodeapi.Heartbeat(
            id="n_fake-loop", loaded_models=["m9"], boot_id="b", engine=nodeapi.EngineState(state="serving")
        )
    )
    status, _, models = http("GET", leader.url + "/v1/models", key=leader.key)
    assert "m9" in {m["id"] for m in models["data"]}


def test_an_unknown_node_heartbeat_is_404_so_the_worker_registers(leader: Leader, token: str) -> None:
    stranger = FakeWorker(leader, token, "n_never-registered")
    status, body = stranger.heartbeat(nodeapi.Heartbeat(id="n_never-registered", loaded_models=[], boot_id="x"))
    assert status == 404 and "register" in body["error"]["message"]


def test_forged_skewed_replayed_and_bearer_calls_are_refused(leader: Leader, token: str) -> None:
    worker = FakeWorker(leader, token)
    worker.register()
    hb = nodeapi.Heartbeat(id=NODE, loaded_models=[], boot_id="boot-1")
    forged = FakeWorker(leader, "sk-node-t_nothing.wrong")
    status, body = worker.heartbeat(hb, header=forged.header(nodeapi.PATH_HEARTBEAT))
    assert status == 401 and "signature does not match" in body["error"]["message"]
    status, body = worker.heartbeat(hb, header=worker.header(nodeapi.PATH_HEARTBEAT, now=time.time() - 400))
    assert status == 401 and "sync the clocks" in body["error"]["message"]
    once = worker.header(nodeapi.PATH_HEARTBEAT)
    assert worker.heartbeat(hb, header=once)[0] == 200
    status, body = worker.heartbeat(hb, header=once)
    assert status == 403 and "replayed" in body["error"]["message"]
    plain = sign(NODE, token, "POST", nodeapi.PATH_HEARTBEAT)
    assert worker.heartbeat(hb, header=plain)[0] == 200
    assert worker.heartbeat(hb, header=plain)[0] == 403
    status, body = worker.post(nodeapi.PATH_HEARTBEAT, hb, header=None, extra={"Authorization": f"Bearer {token}"})
    assert status == 401 and "no X-Opod-Auth header" in body["error"]["message"]


def test_a_body_that_does_not_fit_names_the_field(leader: Leader, token: str) -> None:
    worker = FakeWorker(leader, token)
    worker.register()
    status, body = worker.post(
        nodeapi.PATH_HEARTBEAT, b'{"id":"n_fake-1","loaded_models":"m1"}', worker.header(nodeapi.PATH_HEARTBEAT)
    )
    assert status == 400 and "loaded_models: expected an array" in body["error"]["message"]


def test_a_revoked_node_token_is_refused_at_once(leader: Leader) -> None:
    status, created = leader.admin("POST", "/api/v1/node-tokens", {"name": "short-lived"})
    worker = FakeWorker(leader, created["secret"], "n_fake-revoked")
    assert worker.register()[0] == 200
    assert leader.admin("DELETE", f"/api/v1/node-tokens/{created['id']}")[0] == 200
    status, body = worker.heartbeat(nodeapi.Heartbeat(id="n_fake-revoked", loaded_models=[], boot_id="b"))
    assert status == 403 and "revoked" in body["error"]["message"]


def test_the_worker_refuses_unsigned_and_replayed_leader_calls(leader: Leader, token: str, tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "w"
    worker = OpodProcess(
        ["join", leader.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{port}"],
        home,
        env=clean_env(home, OPOD_NODE_ID="n_real-1"),
    )
    try:
        worker.wait_for_line("registered with", timeout=30)
        url = f"http://127.0.0.1:{port}{nodeapi.PATH_MODEL_LOAD}"
        body = nodeapi.LoadModelRequest(id="sim-x").to_wire()
        status, _, text = http("POST", url, body)
        assert status == 401 and "no X-Opod-Auth header" in text
        status, _, text = http("POST", url, body, key=token)
        assert status == 401
        signed = sign("n_real-1", token, "POST", nodeapi.PATH_MODEL_LOAD, nonce="lead.1")
        import urllib.request

        def call(header: str) -> int:
            request = urllib.request.Request(
                url,
                data=json.dumps(body).encode(),
                method="POST",
                headers={HEADER: header, "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code

        import urllib.error

        assert call(signed) == 200
        assert call(signed) == 401
        wait_until(
            lambda: "sim-x" in (_models_of(leader, "n_real-1") or []), 30, "the worker to report the loaded model"
        )
        tokenize = nodeapi.TokenizeRequest(
            model="sim-x", messages=[nodeapi.TokenizeMessage(role="user", content="hello there")]
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{nodeapi.PATH_TOKENIZE}",
            data=tokenize.to_json().encode(),
            method="POST",
            headers={
                HEADER: sign("n_real-1", token, "POST", nodeapi.PATH_TOKENIZE, nonce="lead.2"),
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            tokens = nodeapi.TokenizeResponse.from_wire(response.read()).tokens
        assert tokens and all(isinstance(t, int) for t in tokens)
        # The data path through the worker (a leader on another machine uses it): signed, routed by X-Opod-Model.
        chat = json.dumps({"model": "sim-x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
        relay = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=chat,
            method="POST",
            headers={
                HEADER: sign("n_real-1", token, "POST", "/v1/chat/completions", nonce="lead.3"),
                "Content-Type": "application/json",
                "X-Opod-Model": "sim-x",
            },
        )
        with urllib.request.urlopen(relay, timeout=10) as response:
            assert json.loads(response.read())["choices"][0]["message"]["content"]
        relay.headers[HEADER.capitalize()] = sign("n_real-1", token, "POST", "/v1/chat/completions", nonce="lead.4")
        relay.headers["X-opod-model"] = "not-here"
        try:
            urllib.request.urlopen(relay, timeout=10)
            raise AssertionError("a model the worker does not hold must be refused")
        except urllib.error.HTTPError as error:
            assert error.code == 409 and error.headers["X-Opod-Worker-Error"] == "model_not_loaded"
    finally:
        worker.stop()
