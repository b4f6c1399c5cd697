"""Federation between two real leaders on loopback: a peer added and checked, its models served as PEER/MODEL,
fallbacks to a peer, removal refused while one is named, and a loop between clusters refused with 508."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import sim_worker, usage_rows, wait_until

NEAR, FAR = "sim-near", "sim-far"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Leader, Leader, Path]]:
    root = tmp_path_factory.mktemp("federation")
    near, far = Leader(root / "near"), Leader(root / "far")
    workers = [sim_worker(near, root / "w-near", "n_near"), sim_worker(far, root / "w-far", "n_far")]
    for worker in workers:
        worker.wait_for_line("registered with", timeout=30)
    for leader, model in ((near, NEAR), (far, FAR)):
        status, body = leader.admin("POST", "/api/v1/models", {"name": model, "profiles": [{"engine": "sim"}]})
        assert status == 200, body
        leader.wait_served(model)
    # The far cluster issues near a key of its own, as its operator would.
    status, made = far.admin("POST", "/api/v1/keys", {"name": "for-near"})
    assert status == 201, made
    key_file = root / "far.key"
    key_file.write_text(made["secret"] + "\n")
    yield near, far, key_file
    for worker in workers:
        worker.stop()
    near.stop()
    far.stop()


def chat(leader: Leader, model: str, headers: dict[str, str] | None = None) -> tuple[int, dict, dict]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3})
    request = urllib.request.Request(
        leader.url + "/v1/chat/completions",
        data=body.encode(),
        method="POST",
        headers={"Authorization": f"Bearer {leader.key}", "Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, json.loads(error.read())


def add_far(near: Leader, far: Leader, key_file: Path) -> tuple[int, dict]:
    return near.admin("POST", "/api/v1/federation", {"name": "far", "url": far.url, "key_file": str(key_file)})


def test_a_peer_is_checked_before_it_is_kept_and_its_models_are_offered(clusters) -> None:
    near, far, key_file = clusters
    status, peer = add_far(near, far, key_file)
    assert status == 201, peer
    far_cluster = far.admin("GET", "/api/v1/federation")[1]["cluster"]
    assert peer["up"] is True and peer["cluster"] == far_cluster and peer["latency_ns"] > 0
    assert {"name": f"far/{FAR}", "upstream": FAR} in peer["models"]
    listed = near.admin("GET", "/api/v1/federation")[1]
    assert listed["cluster"] != far_cluster and [p["name"] for p in listed["peers"]] == ["far"]
    listing = urllib.request.Request(near.url + "/v1/models", headers={"Authorization": f"Bearer {near.key}"})
    with urllib.request.urlopen(listing, timeout=10) as answer:
        models = json.loads(answer.read())["data"]
    assert f"far/{FAR}" in {m["id"] for m in models}
    rows = near.admin("GET", "/api/v1/audit?limit=10")[1]
    assert any(r["action"] == "POST /api/v1/federation" and r["target"] == "peer:far" for r in rows), rows


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"url": "http://127.0.0.1:1"}, "not usable"),
        ({"key_file": "/nonexistent/far.key"}, "cannot read the key file"),
        ({"url": "http://127.0.0.1:1/v1"}, "ends in /v1"),
        ({"name": "a/b"}, "not a peer name"),
        ({"key_file": "vault:secret/far"}, "vault:PATH#FIELD"),
    ],
)
def test_a_peer_that_cannot_be_used_is_refused_and_nothing_is_kept(clusters, change: dict, said: str) -> None:
    near, far, key_file = clusters
    body = {"name": "east", "url": far.url, "key_file": str(key_file), **change}
    status, answer = near.admin("POST", "/api/v1/federation", body)
    assert status == 400 and said in answer["error"], answer
    assert "east" not in [p["name"] for p in near.admin("GET", "/api/v1/federation")[1]["peers"]]


def test_a_cluster_cannot_be_its_own_peer(clusters) -> None:
    near, _, _ = clusters
    own_key = Path(near.home) / "self.key"
    own_key.write_text(near.key)
    body = {"name": "self", "url": near.url, "key_file": str(own_key)}
    status, answer = near.admin("POST", "/api/v1/federation", body)
    assert status == 400 and "this cluster itself" in answer["error"], answer


def test_a_peers_model_is_served_through_the_peer_and_metered_on_both_sides(clusters) -> None:
    near, far, key_file = clusters
    assert add_far(near, far, key_file)[0] == 201
    status, headers, body = chat(near, f"far/{FAR}")
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]
    request_id = headers["x-request-id"]
    mine = wait_until(lambda: [r.data for r in usage_rows(near) if r.data.request_id == request_id], 10, "near's row")
    assert mine[0].model == f"far/{FAR}" and mine[0].route == {"peer": "far"}
    theirs = wait_until(lambda: [r.data for r in usage_rows(far) if r.data.request_id == request_id], 10, "far's row")
    assert theirs[0].model == FAR and theirs[0].completion_tokens == mine[0].completion_tokens > 0


def test_fallbacks_may_name_a_peers_model_and_the_peer_stays_while_one_does(clusters) -> None:
    near, far, key_file = clusters
    assert add_far(near, far, key_file)[0] == 201
    status, answer = near.admin("PUT", f"/api/v1/models/{NEAR}/fallbacks", {"fallbacks": ["far/no-such"]})
    assert status == 400 and "does not offer" in answer["error"], answer
    status, answer = near.admin("PUT", f"/api/v1/models/{NEAR}/fallbacks", {"fallbacks": ["east/x"]})
    assert status == 400 and "not known" in answer["error"], answer
    assert near.admin("PUT", f"/api/v1/models/{NEAR}/fallbacks", {"fallbacks": [f"far/{FAR}"]})[0] == 200
    status, answer = near.admin("DELETE", "/api/v1/federation/far")
    assert status == 409 and NEAR in answer["error"], answer
    assert near.admin("PUT", f"/api/v1/models/{NEAR}/fallbacks", {"fallbacks": []})[0] == 200
    assert near.admin("DELETE", "/api/v1/federation/far") == (200, {"removed": "far"})
    status, _, body = chat(near, f"far/{FAR}")
    assert status in (404, 503), body  # no peer of that name any more


def test_a_request_that_comes_back_round_a_loop_is_refused_with_508(clusters) -> None:
    near, far, key_file = clusters
    assert add_far(near, far, key_file)[0] == 201
    near_cluster = near.admin("GET", "/api/v1/federation")[1]["cluster"]
    far_cluster = far.admin("GET", "/api/v1/federation")[1]["cluster"]
    status, _, body = chat(near, NEAR, {"X-Llmgw-Hop": far_cluster + ", " + near_cluster})
    assert status == 508 and body["error"]["code"] == "loop_detected", body
    # Sent on to far, the request names far's cluster among its hops: far refuses it, and near says so.
    status, _, body = chat(near, f"far/{FAR}", {"X-Llmgw-Hop": far_cluster})
    assert status == 508 and far_cluster in body["error"]["message"], body


class _Capture(BaseHTTPRequestHandler):
    """A peer cluster's front as far as near can tell: ready, one model, and every request's headers kept."""

    seen: list[dict[str, str]] = []

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Llmgw-Cluster", "cl_capture")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/readyz":
            self._answer(200, {"ready": True})
        else:
            self._answer(200, {"object": "list", "data": [{"id": "echo", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        self._answer(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "model": "echo",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
            },
        )

    def log_message(self, *args: object) -> None:
        return None


def test_tags_go_to_a_peer_only_when_asked_and_a_key_may_come_from_the_environment(
    clusters, monkeypatch: pytest.MonkeyPatch
) -> None:
    near, _, _ = clusters
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("CAPTURE_PEER_KEY", "sk-capture")
    try:
        for send_tags in (False, True):
            body = {"name": "cap", "url": url, "key_file": "env:CAPTURE_PEER_KEY", "send_tags": send_tags}
            status, peer = near.admin("POST", "/api/v1/federation", body)
            assert status == 201 and peer["cluster"] == "cl_capture", peer
            assert chat(near, "cap/echo")[0] == 200
        quiet, tagged = _Capture.seen[-2:]
        assert quiet["authorization"] == "Bearer sk-capture" and "x-llmgw-tags" not in quiet
        near_cluster = near.admin("GET", "/api/v1/federation")[1]["cluster"]
        assert quiet["x-llmgw-hop"] == near_cluster
        assert tagged["x-llmgw-tags"].startswith(f"cluster={near_cluster}")
        assert near.admin("DELETE", "/api/v1/federation/cap")[0] == 200
    finally:
        server.shutdown()
