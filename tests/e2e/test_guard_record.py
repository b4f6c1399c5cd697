"""What the guardrails did to a request is in its record (``GET /api/v1/requests/{id}``), on one real leader
with a simulator worker and a mounted policy file naming guardrail webhooks served by this test.

The webhook decides by a word in the request: the ``screen`` guardrail (pre, fails closed) blocks
``BLOCKME``, rewrites ``REDACTME`` and breaks on ``BREAKME``; ``lenient`` (pre, fails open) breaks on
``WOBBLE``; ``answers`` (post) withholds the answer to ``HIDEANSWER`` and blocks the answer to
``STOPANSWER``. Requests go through the ``openai`` package, each with its own ``X-Request-Id``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from bench.ports import free_port
from tests.support.chats import ask
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
NODE = "n_guard"


def last_user_text(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    return str(messages[-1].get("content", "")) if isinstance(messages, list) and messages else ""


async def judge(request: web.Request) -> web.Response:
    payload = await request.json()
    name, text = request.match_info["name"], last_user_text(payload["request"])
    if name == "screen":
        if "BLOCKME" in text:
            return web.json_response({"action": "block", "reason": "it names a forbidden word"})
        if "BREAKME" in text:
            return web.json_response({"error": "down"}, status=500)
        if "REDACTME" in text:
            rewritten = json.loads(json.dumps(payload["request"]).replace("REDACTME", "[redacted]"))
            return web.json_response({"action": "rewrite", "body": rewritten, "reason": "redacted a name"})
    if name == "lenient" and "WOBBLE" in text:
        return web.json_response({"error": "flaky"}, status=500)
    if name == "answers":
        if "STOPANSWER" in text:
            return web.json_response({"action": "block", "reason": "the answer is not for this project"})
        if "HIDEANSWER" in text:
            answer = payload["response"]
            answer["choices"][0]["message"]["content"] = "[withheld]"
            return web.json_response({"action": "rewrite", "body": answer, "reason": "withheld the answer"})
    return web.json_response({"action": "allow"})


class Webhook:
    """The guardrail webhook server (aiohttp), on its own event loop in a thread."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        app = web.Application()
        app.router.add_post("/{name}", judge)
        self.runner = web.AppRunner(app, access_log=None)
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Fleet:
    def __init__(self, leader: Leader, policy: Path, webhook: Webhook) -> None:
        self.leader, self.policy, self.webhook = leader, policy, webhook
        self.client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)

    def guarded(self) -> dict:
        return {
            "guardrails": [
                {"id": "screen", "phase": "pre", "url": self.webhook.url("screen")},
                {"id": "lenient", "phase": "pre", "url": self.webhook.url("lenient"), "failOpen": True},
                {"id": "answers", "phase": "post", "url": self.webhook.url("answers")},
            ]
        }

    def mount(self, policy: dict) -> None:
        """Write the policy file as a manager does, and wait until the leader applies it."""
        revision = "r-" + secrets.token_hex(4)
        tmp = self.policy.with_name(self.policy.name + ".tmp")
        tmp.write_text(json.dumps({"revision": revision, **policy}))
        os.replace(tmp, self.policy)

        def applied() -> bool:
            status, _, page = http(
                "GET", self.leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=self.leader.key
            )
            assert status == 200, page
            return any(
                e.get("type") == "policy.updated" and (e.get("data") or {}).get("revision") == revision
                for e in page.get("events") or []
            )  # type: ignore[union-attr]

        wait_until(applied, 15, f"policy {revision} to be applied")

    def ask(self, content: str, **extra: Any) -> tuple[str, Any]:
        """A chat request: its request id, and its answer's text or the error it raised."""
        return ask(self.client, MODEL, content, **extra)

    def record(self, request_id: str) -> dict:
        return self.leader.request_record(request_id)


def guard(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.startswith("guard_") and k != "guard_ms"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root: Path = tmp_path_factory.mktemp("guard")
    webhook = Webhook()
    files = root / "mounted"
    files.mkdir()
    policy = files / "policy.json"
    leader: Leader | None = None
    worker: OpodProcess | None = None
    try:
        leader = Leader(root / "leader", env={"OPOD_POLICY_FILE": str(policy)})
        worker = sim_worker(
            leader, root / "worker", NODE, OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 0.0, "output_max": 8})
        )
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        fleet = Fleet(leader, policy, webhook)
        fleet.mount(fleet.guarded())
        yield fleet
    finally:
        if worker is not None:
            worker.stop()
        if leader is not None:
            leader.stop()
        webhook.close()


def test_a_blocked_request_is_recorded_with_its_guardrail_and_reason(fleet: Fleet) -> None:
    request_id, refused = fleet.ask("please BLOCKME now")
    assert isinstance(refused, openai.BadRequestError) and "guardrail_blocked" in str(refused.body)
    record = fleet.record(request_id)
    assert record["status"] == 400
    assert guard(record) == {
        "guard_action": "block",
        "guard_policy": "screen",
        "guard_rule": "pre",
        "guard_category": "it names a forbidden word",
    }
    assert record["guard_ms"] >= 0 and record.get("completion_tokens", 0) == 0  # no engine saw it


def test_a_rewritten_request_is_recorded_as_a_rewrite(fleet: Fleet) -> None:
    request_id, answer = fleet.ask("hello REDACTME")
    assert isinstance(answer, str)
    record = fleet.record(request_id)
    assert record["status"] == 200 and record["completion_tokens"] > 0
    assert guard(record) == {
        "guard_action": "rewrite",
        "guard_policy": "screen",
        "guard_rule": "pre",
        "guard_category": "redacted a name",
    }


def test_a_plain_request_through_the_guardrails_is_allowed_and_a_failure_open_noted(fleet: Fleet) -> None:
    request_id, _ = fleet.ask("nothing to see")
    assert guard(fleet.record(request_id)) == {"guard_action": "allow", "guard_policy": "screen", "guard_rule": "pre"}
    request_id, answer = fleet.ask("a little WOBBLE", stream=True)
    assert answer  # the stream went on: lenient fails open, and a stream's answer is never judged
    assert guard(fleet.record(request_id)) == {
        "guard_action": "failed_open",
        "guard_policy": "lenient",
        "guard_rule": "pre",
        "guard_category": "it answered HTTP 500",
    }


def test_a_guardrail_failing_closed_is_recorded_with_the_503(fleet: Fleet) -> None:
    request_id, refused = fleet.ask("BREAKME")
    assert isinstance(refused, openai.APIStatusError) and refused.status_code == 503
    record = fleet.record(request_id)
    assert record["status"] == 503
    assert guard(record) == {
        "guard_action": "unavailable",
        "guard_policy": "screen",
        "guard_rule": "pre",
        "guard_category": "it answered HTTP 500",
    }


def test_the_answer_judged_after_the_engine_is_recorded_with_what_the_client_got(fleet: Fleet) -> None:
    request_id, answer = fleet.ask("HIDEANSWER please")
    assert answer == "[withheld]"
    record = fleet.record(request_id)
    assert record["status"] == 200 and record["replica"] == NODE
    assert guard(record) == {
        "guard_action": "rewrite",
        "guard_policy": "answers",
        "guard_rule": "post",
        "guard_category": "withheld the answer",
    }
    request_id, refused = fleet.ask("STOPANSWER please")
    assert isinstance(refused, openai.BadRequestError) and "blocked the answer" in str(refused.body)
    record = fleet.record(request_id)
    assert record["status"] == 400 and record["completion_tokens"] > 0  # the engine answered: its tokens count
    assert guard(record) == {
        "guard_action": "block",
        "guard_policy": "answers",
        "guard_rule": "post",
        "guard_category": "the answer is not for this project",
    }


def test_a_request_without_guardrails_has_no_guard_fields(fleet: Fleet) -> None:
    fleet.mount({})
    try:
        request_id, answer = fleet.ask("BLOCKME is harmless without guardrails")
        assert isinstance(answer, str)
        record = fleet.record(request_id)
        assert record["status"] == 200
        assert not [k for k in record if k.startswith("guard_")], record
    finally:
        fleet.mount(fleet.guarded())
