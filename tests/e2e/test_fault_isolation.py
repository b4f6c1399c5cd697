"""A fault is charged to what failed: an engine's refusal of a request is the client's 400 and never takes a
worker out; one model's crash leaves the worker's other models serving, and the crashed model serves again
as soon as its engine is ready; while it cannot, its 503 says why."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import Leader, OpodProcess, descendants, http, opod_cli, sim_worker, wait_until

CHAT, OTHER = "sim-chat", "sim-other"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("isolation")
    leader = InProcessLeader(root / "leader")
    worker = sim_worker(leader, root / "worker", "n_iso")
    worker.wait_for_line("registered with", timeout=30)
    for model in (CHAT, OTHER):
        assert opod_cli(leader, "model", "add", model, "--engine", "sim").returncode == 0
    leader.wait_served(CHAT, OTHER, timeout=60)
    yield leader, worker
    worker.stop()
    leader.stop()


def engine_url(worker: OpodProcess, model: str) -> str:
    urls = re.findall(rf"{model} serving on (http://127\.0\.0\.1:\d+)", worker.output)
    assert urls, worker.output
    return urls[-1]


def engine_pid(worker: OpodProcess, model: str) -> int:
    for pid in descendants(worker.proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sim" in argv and b"--model" in argv and argv[argv.index(b"--model") + 1] == model.encode():
            return pid
    raise AssertionError(f"no engine process for {model} under the worker")


def set_faults(url: str, **settings: object) -> None:
    request = urllib.request.Request(
        url + "/sim/faults",
        data=json.dumps(settings).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).read()


def chat(leader: Leader | InProcessLeader, model: str, max_tokens: int = 2) -> tuple[int, dict, object]:
    return http(
        "POST",
        leader.url + "/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens},
        key=leader.key,
        timeout=30,
    )


def client(leader: Leader | InProcessLeader) -> openai.OpenAI:
    return openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)


def engine_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("status", [400, 422, 500])
def test_repeated_engine_refusals_are_400s_and_leave_the_worker_serving(fleet, status: int) -> None:
    leader, worker = fleet
    set_faults(engine_url(worker, CHAT), fail_next=4, fail_status=status)
    for _ in range(4):
        with pytest.raises(openai.BadRequestError) as refused:
            client(leader).chat.completions.create(
                model=CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert "injected failure" in refused.value.message
    _, _, ready = http("GET", leader.url + "/readyz")
    assert isinstance(ready, dict) and ready["ready"] is True and set(ready["models"]) == {CHAT, OTHER}, ready
    assert chat(leader, OTHER)[0] == 200
    assert chat(leader, CHAT)[0] == 200
    status_code, nodes = leader.admin("GET", "/api/v1/opod/node-models")
    assert status_code == 200 and list(nodes.values())[0] == {CHAT: "serving", OTHER: "serving"}, nodes


def test_a_killed_engine_leaves_the_other_model_answering_and_its_own_back_as_soon_as_it_is_ready(fleet) -> None:
    leader, worker = fleet
    url = engine_url(worker, CHAT)
    # Under load: requests in flight when the engine dies, and more that meet it dead before its worker says so.
    in_flight = [threading.Thread(target=chat, args=(leader, CHAT, 400)) for _ in range(6)]
    for thread in in_flight:
        thread.start()
    time.sleep(0.5)
    os.kill(engine_pid(worker, CHAT), signal.SIGKILL)
    burst = [threading.Thread(target=chat, args=(leader, CHAT)) for _ in range(6)]
    for thread in burst:
        thread.start()
    for thread in in_flight + burst:
        thread.join()
    other: list[int] = []
    down: list[tuple[dict, object]] = []
    readyz: list[object] = []
    ready_at = back_at = None
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and back_at is None:
        other.append(chat(leader, OTHER)[0])
        status, headers, body = chat(leader, CHAT)
        now = time.monotonic()
        if status == 503:
            down.append((headers, body))
            readyz.append(http("GET", leader.url + "/readyz")[2])
        elif status == 200 and ready_at is not None:
            back_at = now
        if ready_at is None and engine_ready(url):
            ready_at = time.monotonic()
        time.sleep(0.05)
    assert set(other) == {200}, f"the other model must answer throughout: {other}"
    assert back_at is not None and ready_at is not None, "the killed model's engine came back and served"
    assert back_at - ready_at < 3.0, f"served {back_at - ready_at:.1f}s after its engine was ready"
    assert down, "requests to the killed model while its engine was down were 503s"
    for headers, body in down:
        assert isinstance(body, dict), body
        message = body["error"]["message"]
        assert re.search(r"crashed|restarting|cooling down|connect|refused", message, re.I), message
        assert 1 <= int(headers["retry-after"]) <= 10, headers
    assert all(isinstance(r, dict) and r["ready"] is True for r in readyz), readyz
    assert any(CHAT in r.get("not_serving", {}) for r in readyz if isinstance(r, dict)), readyz


# --- the real llama-server ----------------------------------------------------------------------------------------

LLAMA_CHAT, LLAMA_EMBED = "smollm2-135m-instruct", "all-minilm-l6-v2"

IMAGE = [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
]
BAD_INPUTS = [
    ({"grammar": "root ::= ("}, None, "grammar"),
    ({"n_probs": "many"}, None, "n_probs"),
    ({"json_schema": {"type": "bogus"}}, None, "schema"),
    ({}, IMAGE, "image"),
]
"""Requests real llama-server refuses itself, each with the word its refusal names: the first three are 400s from
the engine; an image part to a text model is its 500 (or opod's own 400, where its edge checks catch it first)."""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    leader = Leader(tmp_path_factory.mktemp("isolation-up") / "home")
    leader.wait_served(LLAMA_CHAT, LLAMA_EMBED, timeout=150)
    yield leader
    leader.process.stop()


@pytest.mark.engine
def test_bad_requests_that_reach_llama_server_leave_both_models_serving(up: Leader) -> None:
    llm = client(up)
    for _ in range(3):
        for extra, messages, named in BAD_INPUTS:
            with pytest.raises(openai.BadRequestError) as refused:
                llm.chat.completions.create(
                    model=LLAMA_CHAT,
                    messages=messages or [{"role": "user", "content": "hi"}],
                    max_tokens=3,
                    extra_body=extra,
                )
            assert named in refused.value.message, refused.value.message
    _, _, ready = http("GET", up.url + "/readyz")
    assert isinstance(ready, dict) and ready["ready"] is True and {LLAMA_CHAT, LLAMA_EMBED} <= set(ready["models"]), (
        ready
    )
    assert llm.embeddings.create(model=LLAMA_EMBED, input="hi").data[0].embedding
    answer = llm.chat.completions.create(
        model=LLAMA_CHAT, messages=[{"role": "user", "content": "Say hi."}], max_tokens=3
    )
    assert answer.choices[0].message.content is not None
    wait_until(lambda: "serving on" in opod_cli(up, "model", "ls").stdout, 10, "opod model ls to say serving")
