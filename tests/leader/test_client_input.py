"""What a careless or hostile client sends a real leader, on ``/v1``, ``/api/v1`` and ``/admin/v1``.

Nothing is told to a stranger that only the operator should know: no path of the leader's, no line
of an engine's log, no whole echo of what was sent.

The leader is built in this process (``tests.support.inprocess``); its worker is a real ``opod join``
with the simulator engine.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker

CHAT, CATALOG_CHAT, CRASHY = "sim-chat", "smollm2-135m-instruct", "sim-crashy"
PLAIN_EMBED, MATRYOSHKA = "all-minilm-l6-v2", "nomic-embed-text-v1.5-gguf"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessLeader, OpodProcess]]:
    root = tmp_path_factory.mktemp("client-input")
    leader = InProcessLeader(root / "leader")
    worker = sim_worker(leader, root / "worker", "n1")
    try:
        worker.wait_for_line("registered with", timeout=30)
        for model in (CHAT, CATALOG_CHAT, PLAIN_EMBED, MATRYOSHKA):
            added = opod_cli(leader, "model", "add", model, "--engine", "sim")
            assert added.returncode == 0, added.stderr
        status, body = leader.admin(
            "POST",
            "/api/v1/models",
            {"name": "sim-defined", "aliases": ["friendly"], "profiles": [{"engine": "sim"}], "scaling": {"min": 1}},
        )
        assert status == 200, body
        leader.wait_served(CHAT, CATALOG_CHAT, PLAIN_EMBED, MATRYOSHKA, "sim-defined", timeout=90)
        yield leader, worker
    finally:
        worker.stop()
        leader.stop()


def send(url: str, body: bytes | str, key: str | None, method: str = "POST") -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.request(method, url, content=body, headers=headers, timeout=30)


def client(leader: InProcessLeader) -> openai.OpenAI:
    return openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)


# --- what a stranger learns ------------------------------------------------------------------------


def test_a_caller_without_the_admin_key_is_not_told_where_the_leader_keeps_it(fleet) -> None:
    leader, _ = fleet
    home = str(leader.home.resolve())
    for url in (leader.url + "/admin/v1/nodes", leader.admin_url + "/api/v1/nodes"):
        for key in (None, "sk-wrong"):
            answer = send(url, b"", key, method="GET")
            assert answer.status_code == 401, answer.text
            assert home not in answer.text and "/admin.key" not in answer.text.replace("~/.opod/admin.key", ""), (
                answer.text
            )
            assert "admin.key" in answer.text, "it still says which file, in words"


def test_a_long_model_name_is_not_echoed_whole(fleet) -> None:
    leader, _ = fleet
    name = "m" * 10_000
    answer = send(leader.url + "/v1/chat/completions", json.dumps({"model": name, "messages": HELLO}), leader.key)
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found", answer.text[:200]
    assert len(answer.text) < 1000 and "mmmm" in answer.text, answer.text[:300]
    retrieved = send(leader.url + "/v1/models/" + name, b"", leader.key, method="GET")
    assert retrieved.status_code == 404 and len(retrieved.text) < 1000, retrieved.text[:300]


def test_while_an_engine_crashes_its_503_says_so_in_opods_words_and_the_log_has_its_own(
    fleet, caplog: pytest.LogCaptureFixture
) -> None:
    leader, _ = fleet
    caplog.set_level(logging.INFO, logger="opod.gateway")
    # Every request crashes this model's engine: it keeps restarting, and its log says why.
    status, body = leader.admin(
        "POST",
        "/api/v1/models",
        {
            "name": CRASHY,
            "profiles": [{"engine": "sim", "args": ["--crash-after", "0"]}],
            "scaling": {"min": 1},
        },
    )
    assert status == 200, body
    leader.wait_served(CRASHY, timeout=60)
    refusals: list[str] = []
    deadline = time.monotonic() + 40
    said_crashed = re.compile(r"engine (crashed|keeps crashing)")
    while time.monotonic() < deadline and not any(said_crashed.search(r) for r in refusals):
        answer = send(leader.url + "/v1/chat/completions", json.dumps({"model": CRASHY, "messages": HELLO}), leader.key)
        if answer.status_code == 503:
            refusals.append(answer.json()["error"]["message"])
        time.sleep(0.2)
    assert any(said_crashed.search(r) for r in refusals), refusals
    for message in refusals:
        assert "crashing on purpose" not in message, message  # the engine's own log line
        assert not re.search(r"\d+\.\d+\.\d+\.\d+:\d+|Connect call failed|/", message), message
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "opod.gateway")
    assert "crashing on purpose" in logged, "the leader's log keeps what the client is not told"
    leader.admin("DELETE", f"/api/v1/models/{CRASHY}")
