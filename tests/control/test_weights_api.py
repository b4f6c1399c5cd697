"""``/api/v1/weights``: weights on a node's disk that no model uses are listed, collected and gone; the weights a
served model needs are never listed and never deleted, and the worker refuses any path outside its cache.

Against a leader built in the test's process and a real ``opod join`` whose llama.cpp engine is the simulator
speaking llama-server's wire (``OPOD_LLAMA_SERVER`` names a stand-in script), so the worker loads a real file from
its own weights cache.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.ports import free_port
from opod.contract import nodeapi
from opod.security.signer import Signer
from opod.weights import write_tiny_llama
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, clean_env, http, wait_until

NODE = "n_weights"
MODEL = "local-tiny"

STAND_IN = """#!/bin/sh
# llama-server stand-in: the simulator, speaking llama.cpp's wire on the port and alias asked for.
port=""; alias=sim
while [ $# -gt 0 ]; do
  case "$1" in --port) port=$2; shift;; --alias) alias=$2; shift;; esac
  shift
done
[ -z "$port" ] && exit 0  # --list-devices and the like: nothing to say
exec {python} -m opod sim --dialect llamacpp --port "$port" --model "$alias"
"""


@dataclass
class Fleet:
    leader: Leader
    worker: OpodProcess
    worker_url: str
    token: str
    cache: Path
    in_use: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("weights")
    stand_in = root / "llama-server"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    leader = Leader(root / "leader")
    token = leader.node_token()
    home = root / "worker"
    cache = home / "models"
    in_use = cache / "local" / "tiny.gguf"
    write_tiny_llama(in_use)
    port = free_port()
    worker = OpodProcess(
        ["join", leader.url, "--token", token, "--engine", "llamacpp", "--listen", f"127.0.0.1:{port}"],
        home,
        env=clean_env(home, OPOD_NODE_ID=NODE, OPOD_LLAMA_SERVER=str(stand_in)),
    )
    try:
        worker.wait_for_line("registered with", timeout=60)
        status, body = leader.admin("POST", "/api/v1/models", {"name": MODEL, "source": str(in_use)})
        assert status in (200, 201), body
        wait_until(lambda: MODEL in leader.served(), 60, f"{MODEL} to be served on {NODE}; worker:\n{worker.output}")
        yield Fleet(leader, worker, f"http://127.0.0.1:{port}", token, cache, in_use)
    finally:
        worker.stop()
        leader.stop()


def _stray(cache: Path, rel: str, size: int) -> Path:
    path = cache / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def _signed_worker_call(fleet: Fleet, path: str, body: object) -> tuple[int, object]:
    """A call on the worker's own listener, signed with the node's token as its leader signs it."""
    headers = Signer(NODE, fleet.token).headers("POST", path) | {"Content-Type": "application/json"}
    request = urllib.request.Request(
        fleet.worker_url + path, data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_stray_weights_are_listed_collected_and_gone_while_the_served_model_keeps_its_file(fleet: Fleet) -> None:
    old = _stray(fleet.cache, "hf/someone--retired@main/retired.Q4_0.gguf", 3000)
    sidecar = _stray(fleet.cache, "hf/someone--retired@main/retired.Q4_0.gguf.sha256", 65)
    wheel = _stray(fleet.cache, "pypi/llm-gone-1.0/llm_gone/model.gguf", 1000)
    lock = _stray(
        fleet.cache, "hf/someone--retired@main/.retired.Q4_0.gguf.lock", 0
    )  # a download's lock: never ours to list
    beside = _stray(fleet.cache, "local/tiny.gguf.sha256", 65)  # the served file's digest record belongs to it

    status, body = fleet.leader.admin("GET", "/api/v1/weights/orphans")
    assert status == 200, body
    assert body == [
        {
            "node": NODE,
            "paths": [
                "hf/someone--retired@main/retired.Q4_0.gguf",
                "hf/someone--retired@main/retired.Q4_0.gguf.sha256",
                "pypi/llm-gone-1.0/llm_gone/model.gguf",
            ],
            "bytes": 3000 + 65 + 1000,
        }
    ]

    status, body = fleet.leader.admin("POST", "/api/v1/weights/collect", {})
    assert status == 200, body
    assert body == [{"node": NODE, "files": 3, "bytes": 4065}]
    assert not old.exists() and not sidecar.exists() and not wheel.exists()
    assert not wheel.parent.exists(), "an emptied folder is removed with its last file"
    assert lock.exists() and fleet.in_use.exists() and beside.exists()

    status, body = fleet.leader.admin("GET", "/api/v1/weights/orphans")
    assert (status, body) == (200, [])
    assert MODEL in fleet.leader.served()
    status, _, answer = http(
        "POST",
        fleet.leader.url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        key=fleet.leader.key,
    )
    assert status == 200, answer


def test_collect_for_one_node_and_for_an_unknown_one(fleet: Fleet) -> None:
    _stray(fleet.cache, "converted/retired-f16.gguf", 500)
    status, body = fleet.leader.admin("POST", "/api/v1/weights/collect", {"node": "n_nobody"})
    assert status == 404 and set(body) == {"error"} and "n_nobody" in body["error"], body
    assert (fleet.cache / "converted/retired-f16.gguf").exists(), "a refused call deletes nothing"
    status, body = fleet.leader.admin("POST", "/api/v1/weights/collect", {"node": NODE})
    assert (status, body) == (200, [{"node": NODE, "files": 1, "bytes": 500}])
    status, body = fleet.leader.admin("POST", "/api/v1/weights/collect", {"node": NODE})
    assert (status, body) == (200, [{"node": NODE, "files": 0, "bytes": 0}]), "nothing left to collect"


def test_the_worker_refuses_what_a_served_model_needs_and_paths_outside_its_cache(fleet: Fleet) -> None:
    outside = fleet.cache.parent / "node-secret-copy"
    outside.write_text("not weights")
    asked = [
        "local/tiny.gguf",
        "../node-secret-copy",
        str(outside),
        "local/../../node-secret-copy",
        "no/such/file.gguf",
    ]
    status, body = _signed_worker_call(fleet, nodeapi.PATH_WEIGHTS_DELETE, {"paths": asked})
    assert status == 200, body
    assert isinstance(body, dict) and (body["files"], body["bytes"]) == (0, 0), body
    refused = body["refused"]
    assert "serves or is loading" in refused["local/tiny.gguf"]
    for path in asked[1:4]:
        assert "outside the weights cache" in refused[path], refused
    assert "not a file" in refused["no/such/file.gguf"]
    assert fleet.in_use.exists() and outside.exists()
    status, body = _signed_worker_call(fleet, nodeapi.PATH_WEIGHTS_DELETE, {"paths": []})
    assert status == 200


def test_the_worker_refuses_an_unsigned_call(fleet: Fleet) -> None:
    request = urllib.request.Request(fleet.worker_url + nodeapi.PATH_WEIGHTS, method="GET")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert os.path.exists(fleet.in_use)
