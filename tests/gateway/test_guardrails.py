"""Guardrail webhooks against a real webhook server on loopback: allow, block, rewrite, fail open or closed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from opod.contract.adminapi import GuardrailRule, PolicySnapshot
from opod.gateway.guardrails import GuardrailBlocked, Guardrails, GuardrailUnavailable
from opod.http.errors import error_response
from opod.http.serving import bind
from opod.snapshots.policy import PolicyView, build_view
from tests.snapshots.helpers import eventually, serving

BODY = b'{"model": "m1", "messages": [{"role": "user", "content": "my card is 4111"}]}'
ANSWER = b'{"id": "c1", "choices": [{"message": {"role": "assistant", "content": "ok 4111"}}]}'


class Webhook:
    """A webhook server whose answer depends on the path; it records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    def app(self) -> Starlette:
        async def handle(request: Request) -> Response:
            name = request.path_params["name"]
            payload = await request.json()
            self.calls.append((name, dict(request.headers), payload))
            if name == "allow":
                return JSONResponse({"action": "allow"})
            if name == "empty":
                return Response(status_code=204)
            if name == "block":
                return JSONResponse({"action": "block", "reason": "contains a card number"})
            if name == "redact":
                target = payload["request"] if payload["phase"] == "pre" else payload["response"]
                text = json.dumps(target).replace("4111", "[card]")
                return JSONResponse({"action": "rewrite", "body": json.loads(text), "reason": "redacted"})
            if name == "drop-model":
                return JSONResponse({"action": "rewrite", "body": {"messages": []}})
            if name == "change-model":
                return JSONResponse({"action": "rewrite", "body": {"model": "other", "messages": []}})
            if name == "slow":
                await asyncio.sleep(1.0)
                return JSONResponse({"action": "allow"})
            if name == "error":
                return JSONResponse({"error": "boom"}, status_code=500)
            if name == "notjson":
                return PlainTextResponse("fine, I guess")
            if name == "unknown":
                return JSONResponse({"action": "maybe"})
            if name == "allow-500":
                return Response(b'{"action":"allow"}', status_code=500, media_type="application/json")
            if name == "allow-spaced":
                return Response(b'{ "action" : "allow", "why": "fine" }', media_type="application/json")
            return JSONResponse({"action": "allow"})

        return Starlette(routes=[Route("/{name}", handle, methods=["POST"])])


@pytest.fixture
async def hook() -> AsyncIterator[tuple[Webhook, str]]:
    webhook = Webhook()
    async with serving(webhook.app()) as url:
        yield webhook, url


@pytest.fixture
async def guardrails() -> AsyncIterator[Guardrails]:
    g = Guardrails()
    yield g
    await g.close()


def rule(url: str, phase: str = "pre", id_: str = "pii", **extra: Any) -> GuardrailRule:
    return GuardrailRule.from_wire({"id": id_, "phase": phase, "url": url, **extra})


def dead_url() -> str:
    sock = bind("127.0.0.1", 0, "a closed port")
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/check"


async def test_allow_passes_the_body_unchanged_and_sends_the_designed_request(hook, guardrails) -> None:
    webhook, url = hook
    rules = [rule(f"{url}/allow", authKey="sk-hook", headers={"X-Tenant": "acme"}), rule(f"{url}/empty", id_="second")]
    out = await guardrails.pre(rules, "req_1", "m1", BODY)
    assert out is BODY  # byte for byte: nothing re-encoded
    _, headers, payload = webhook.calls[0]
    assert payload == {
        "phase": "pre",
        "guardrail_id": "pii",
        "request_id": "req_1",
        "model": "m1",
        "request": json.loads(BODY),
        "response": None,
    }
    assert headers["authorization"] == "Bearer sk-hook" and headers["x-tenant"] == "acme"
    assert headers["x-request-id"] == "req_1" and headers["x-opod-guardrail"] == "pii"
    assert [c[0] for c in webhook.calls] == ["allow", "empty"]


async def test_block_refuses_with_400_naming_the_guardrail_and_its_reason(hook, guardrails) -> None:
    _, url = hook
    with pytest.raises(GuardrailBlocked) as caught:
        await guardrails.pre([rule(f"{url}/block")], "req_2", "m1", BODY)
    answer = error_response(caught.value, "req_2")
    body = json.loads(answer.body)
    assert answer.status_code == 400 and body["error"]["code"] == "guardrail_blocked"
    assert body["error"]["message"] == "Guardrail 'pii' blocked the request: contains a card number."


async def test_rewrites_chain_in_order_and_keep_the_model(hook, guardrails) -> None:
    webhook, url = hook
    out = await guardrails.pre([rule(f"{url}/redact"), rule(f"{url}/allow", id_="after")], "req_3", "m1", BODY)
    assert json.loads(out)["messages"][0]["content"] == "my card is [card]"
    assert (
        webhook.calls[1][2]["request"]["messages"][0]["content"] == "my card is [card]"
    )  # the next one saw the rewrite
    out = await guardrails.pre([rule(f"{url}/drop-model")], "req_4", "m1", BODY)
    assert json.loads(out) == {"messages": [], "model": "m1"}
    with pytest.raises(GuardrailUnavailable, match="changed the model"):
        await guardrails.pre([rule(f"{url}/change-model")], "req_5", "m1", BODY)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("error", "HTTP 500"),
        ("notjson", "not JSON"),
        ("unknown", "unknown action 'maybe'"),
        ("allow-500", "HTTP 500"),
    ],
)
async def test_a_broken_webhook_fails_closed_or_open(hook, guardrails, name: str, problem: str) -> None:
    _, url = hook
    with pytest.raises(GuardrailUnavailable) as caught:
        await guardrails.pre([rule(f"{url}/{name}")], "req_6", "m1", BODY)
    answer = error_response(caught.value, "req_6")
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    message = json.loads(answer.body)["error"]["message"]
    assert "Guardrail 'pii' could not be consulted" in message and problem in message
    assert await guardrails.pre([rule(f"{url}/{name}", failOpen=True)], "req_7", "m1", BODY) is BODY


async def test_an_unreachable_webhook_fails_closed_or_open(guardrails) -> None:
    url = dead_url()
    with pytest.raises(GuardrailUnavailable, match=f"cannot reach {url}"):
        await guardrails.pre([rule(url)], "req_8", "m1", BODY)
    assert await guardrails.pre([rule(url, failOpen=True)], "req_9", "m1", BODY) is BODY


async def test_a_slow_webhook_times_out_at_timeout_ms(hook, guardrails) -> None:
    _, url = hook
    start = time.monotonic()
    with pytest.raises(GuardrailUnavailable, match="no answer within 200 ms"):
        await guardrails.pre([rule(f"{url}/slow", timeoutMs=200)], "req_10", "m1", BODY)
    assert time.monotonic() - start < 0.8
    start = time.monotonic()
    assert await guardrails.pre([rule(f"{url}/slow", timeoutMs=200, failOpen=True)], "req_11", "m1", BODY) is BODY
    assert time.monotonic() - start < 0.8


async def test_an_allow_written_any_way_allows(hook, guardrails) -> None:
    _, url = hook
    assert await guardrails.pre([rule(f"{url}/allow-spaced")], "req_20", "m1", BODY) is BODY


async def test_a_new_policy_view_calls_its_own_webhooks(hook, guardrails) -> None:
    webhook, url = hook

    def view(name: str) -> PolicyView:
        return build_view(
            PolicySnapshot.from_wire({"guardrails": [{"id": name, "phase": "pre", "url": f"{url}/{name}"}]})
        )

    allowing, blocking = view("allow"), view("block")
    assert await guardrails.pre(allowing, "req_21", "m1", BODY) is BODY
    with pytest.raises(GuardrailBlocked, match="Guardrail 'block' blocked the request"):
        await guardrails.pre(blocking, "req_22", "m1", BODY)
    assert await guardrails.pre(allowing, "req_23", "m1", BODY) is BODY
    assert [c[0] for c in webhook.calls] == ["allow", "block", "allow"]


async def test_post_sees_the_answer_and_may_block_or_rewrite_it(hook, guardrails) -> None:
    webhook, url = hook
    policy = PolicySnapshot.from_wire(
        {
            "guardrails": [
                {"id": "pre-only", "phase": "pre", "url": f"{url}/block", "failOpen": False},
                {"id": "out", "phase": "post", "url": f"{url}/redact", "failOpen": False},
            ]
        }
    )
    out = await guardrails.post(policy, "req_12", "m1", BODY, ANSWER)
    assert json.loads(out)["choices"][0]["message"]["content"] == "ok [card]"
    payload = webhook.calls[-1][2]
    assert (
        payload["phase"] == "post"
        and payload["response"] == json.loads(ANSWER)
        and payload["request"] == json.loads(BODY)
    )
    with pytest.raises(GuardrailBlocked, match="Guardrail 'out' blocked the answer: contains a card number"):
        await guardrails.post([rule(f"{url}/block", phase="post", id_="out")], "req_13", "m1", BODY, ANSWER)
    assert await guardrails.post([rule(f"{url}/allow", phase="post")], "req_14", "m1", BODY, ANSWER) is ANSWER
    assert await guardrails.post(policy, "req_15", "m1", BODY, ANSWER) != ANSWER


async def test_post_rewrites_chain_and_an_answer_that_is_not_json_goes_as_text(hook, guardrails) -> None:
    webhook, url = hook
    rules = [rule(f"{url}/redact", phase="post", id_="first"), rule(f"{url}/allow", phase="post", id_="second")]
    out = await guardrails.post(rules, "req_16", "m1", BODY, ANSWER)
    assert json.loads(out)["choices"][0]["message"]["content"] == "ok [card]"
    # The second rule judges the answer as the first rewrote it.
    assert webhook.calls[-1][2]["response"]["choices"][0]["message"]["content"] == "ok [card]"
    await guardrails.post([rule(f"{url}/allow", phase="post")], "req_17", "m1", BODY, b"upstream said: \xff no")
    assert webhook.calls[-1][2]["response"] == "upstream said: \ufffd no"


async def test_a_rules_own_request_id_header_is_sent_instead_of_the_requests(hook, guardrails) -> None:
    webhook, url = hook
    await guardrails.pre([rule(f"{url}/allow", headers={"x-request-id": "fixed"})], "req_18", "m1", BODY)
    assert webhook.calls[-1][1]["x-request-id"] == "fixed"
    await guardrails.pre([rule(f"{url}/allow", id_="plain")], "req_19", "m1", BODY)
    assert webhook.calls[-1][1]["x-request-id"] == "req_19"


async def test_logging_only_never_delays_the_answer_and_never_refuses(hook, guardrails) -> None:
    webhook, url = hook
    rules = [
        rule(f"{url}/slow", phase="logging_only", id_="audit"),
        rule(f"{url}/block", phase="logging_only", id_="ignored"),
        rule(dead_url(), phase="logging_only", id_="gone"),
    ]
    start = time.monotonic()
    guardrails.log(rules, "req_16", "m1", BODY, ANSWER, 200)
    assert time.monotonic() - start < 0.05
    # They do not run in pre or post either.
    assert await guardrails.pre(rules, "req_17", "m1", BODY) is BODY
    await eventually(lambda: any(c[0] == "slow" for c in webhook.calls) and any(c[0] == "block" for c in webhook.calls))
    payload = next(c[2] for c in webhook.calls if c[0] == "slow")
    assert payload == {
        "phase": "logging_only",
        "guardrail_id": "audit",
        "request_id": "req_16",
        "model": "m1",
        "request": json.loads(BODY),
        "response": json.loads(ANSWER),
        "status": 200,
    }
    guardrails.log(rules[:1], "req_18", "m1", BODY)  # a streamed answer: no response to show
    await eventually(lambda: any(c[2]["request_id"] == "req_18" for c in webhook.calls))
    assert next(c[2] for c in webhook.calls if c[2]["request_id"] == "req_18")["response"] is None


async def test_no_rules_cost_nothing(guardrails) -> None:
    assert await guardrails.pre(None, "r", "m", BODY) is BODY
    assert await guardrails.pre(PolicySnapshot(), "r", "m", BODY) is BODY
    assert await guardrails.post([], "r", "m", BODY, ANSWER) is ANSWER
    guardrails.log(None, "r", "m", BODY)
