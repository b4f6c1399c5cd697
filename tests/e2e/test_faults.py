"""Faults a fleet meets, and the answer each one gets: specific, prompt, and nothing left running."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import Leader as OpodUp
from tests.support.opod_process import OpodProcess, http, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("faults")
    leader = Leader(root / "leader")
    home = root / "worker"
    worker = sim_worker(leader, home, "n_faulty")
    worker.wait_for_line("registered with", timeout=30)
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
    leader.wait_served(MODEL, timeout=60)
    yield leader, worker
    worker.stop()
    leader.stop()


def engine_url(worker: OpodProcess) -> str:
    urls = re.findall(rf"{MODEL} serving on (http://127\.0\.0\.1:\d+)", worker.output)
    assert urls, worker.output
    return urls[-1]


def sim_state(worker: OpodProcess) -> dict:
    with urllib.request.urlopen(engine_url(worker) + "/sim/state", timeout=5) as response:
        return json.loads(response.read())


def client(leader: Leader) -> openai.OpenAI:
    return openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)


def test_a_known_model_with_no_worker_ready_is_503_with_retry_after(fleet) -> None:
    leader, _ = fleet
    assert opod_cli(leader, "model", "add", "idle-model", "--engine", "sim", "--no-load").returncode == 0
    status, headers, body = http(
        "POST",
        leader.url + "/v1/chat/completions",
        {"model": "idle-model", "messages": [{"role": "user", "content": "x"}]},
        key=leader.key,
    )
    assert status == 503 and headers["retry-after"] and body["error"]["code"] == "no_capacity"


def test_rerank_is_relayed_to_an_engine_that_can(fleet) -> None:
    leader, _ = fleet
    status, _, body = http(
        "POST",
        leader.url + "/v1/rerank",
        {
            "model": MODEL,
            "query": "capital of France",
            "documents": ["Bananas are yellow.", "Paris is the capital of France."],
            "return_documents": True,
        },
        key=leader.key,
    )
    assert status == 200, body
    assert [r["index"] for r in body["results"]] == [1, 0]
    assert body["results"][0]["document"]["text"].startswith("Paris")


def test_an_engine_that_dies_mid_stream_ends_the_stream_with_an_error_and_comes_back(fleet) -> None:
    leader, worker = fleet
    urllib.request.urlopen(
        urllib.request.Request(
            engine_url(worker) + "/sim/faults",
            data=json.dumps({"crash_after_tokens": 3}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        ),
        timeout=5,
    ).read()
    started = time.monotonic()
    received = []
    with pytest.raises(openai.APIError) as cut:
        for chunk in client(leader).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "go on"}],
            max_tokens=50,
            stream=True,
        ):
            received.append(chunk)
    assert time.monotonic() - started < 10, "a dead engine must not leave the client hanging"
    assert received, "the tokens sent before the crash reached the client"
    assert "cut off" in str(cut.value)
    wait_until(
        lambda: (
            http(
                "POST",
                leader.url + "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                key=leader.key,
            )[0]
            == 200
        ),
        60,
        "the supervisor to restart the engine and the model to answer again",
    )


def test_a_client_that_disconnects_mid_stream_stops_the_generation(fleet) -> None:
    leader, worker = fleet
    leader.wait_served(MODEL, timeout=60)
    stream = client(leader).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=4000, stream=True
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    wait_until(lambda: sim_state(worker)["running"] == 0, 10, "the engine to stop generating for a gone client")


def test_a_forgotten_worker_that_is_still_alive_registers_again(fleet, tmp_path: Path) -> None:
    leader, _ = fleet
    home = tmp_path / "spare"
    spare = sim_worker(leader, home, "n_spare")
    try:
        spare.wait_for_line("registered with", timeout=30)
        refused, body = leader.admin("DELETE", "/api/v1/nodes/n_spare")
        assert refused == 409 and "is reachable" in body["error"], "a node that heartbeats is not forgotten"
        os.kill(spare.proc.pid, signal.SIGSTOP)  # unreachable with nothing on it: it may be forgotten
        try:
            wait_until(
                lambda: (
                    {n["id"]: n["state"] for n in leader.admin("GET", "/api/v1/nodes")[1]}["n_spare"] == "unreachable"
                ),
                30,
                "the stopped worker to be unreachable",
                interval=0.5,
            )
            status, body = leader.admin("DELETE", "/api/v1/nodes/n_spare")
            assert (status, body) == (200, {"id": "n_spare", "removed": "true"})
        finally:
            os.kill(spare.proc.pid, signal.SIGCONT)
        refused, body = leader.admin("DELETE", "/api/v1/nodes/n_faulty")
        assert refused == 409 and "is reachable" in body["error"]
        wait_until(
            lambda: sum("registered with" in line for line in spare.lines) >= 2,
            20,
            "the worker to register again after a 404",
        )
        nodes = {n["id"] for n in leader.admin("GET", "/api/v1/nodes")[1]}
        assert "n_spare" in nodes
    finally:
        spare.stop()


@pytest.mark.engine
def test_a_model_that_fails_to_start_says_why(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a GGUF file")
    leader = OpodUp(tmp_path / "home", extra=["--no-default-models"])
    try:
        assert opod_cli(leader, "model", "add", "--gguf", str(bad), "--name", "broken").returncode == 0

        def failed() -> str | None:
            out = opod_cli(leader, "model", "ls").stdout
            return out if "failed on" in out else None

        listing = wait_until(failed, 60, "the failure to be reported")
        assert "broken" in listing
        status, headers, body = http(
            "POST",
            leader.url + "/v1/chat/completions",
            {"model": "broken", "messages": [{"role": "user", "content": "x"}]},
            key=leader.key,
        )
        assert status == 503 and "retry-after" in headers
        assert leader.process.children() == [], "a model that failed to start leaves no engine running"
    finally:
        leader.process.stop()
