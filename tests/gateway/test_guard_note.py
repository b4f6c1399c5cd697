"""The note the guardrails leave on a request: which action decided, which guardrail, in which phase, why,
and how long the webhooks took; against a real webhook server on loopback. And an answer the post
guardrails judge: its row waits for their verdict."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from opod.contract.adminapi import GuardrailRule
from opod.gateway.exchange import Exchange
from opod.gateway.guardrails import MAX_GUARD_CATEGORY, GuardNote, GuardrailBlocked, Guardrails, GuardrailUnavailable
from opod.gateway.meter import Meter
from opod.gateway.outcome import Outcome
from opod.ledger.records import UsageTicket
from tests.snapshots.helpers import serving

BODY = b'{"model": "m1", "messages": [{"role": "user", "content": "my card is 4111"}]}'
ANSWER = b'{"id": "c1", "choices": [{"message": {"role": "assistant", "content": "ok 4111"}}]}'


def webhook() -> Starlette:
    async def handle(request: Request) -> Response:
        name = request.path_params["name"]
        payload = await request.json()
        if name == "block":
            return JSONResponse({"action": "block", "reason": "contains a card number"})
        if name == "long-block":
            return JSONResponse({"action": "block", "reason": "x" * 1000})
        if name == "redact":
            target = payload["request"] if payload["phase"] == "pre" else payload["response"]
            return JSONResponse(
                {
                    "action": "rewrite",
                    "body": json.loads(json.dumps(target).replace("4111", "[card]")),
                    "reason": "redacted a card number",
                }
            )
        if name == "slow":
            await asyncio.sleep(0.15)
        if name == "error":
            return JSONResponse({"error": "boom"}, status_code=500)
        return JSONResponse({"action": "allow"})

    return Starlette(routes=[Route("/{name}", handle, methods=["POST"])])


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with serving(webhook()) as base:
        yield base


@pytest.fixture
async def guardrails() -> AsyncIterator[Guardrails]:
    g = Guardrails()
    yield g
    await g.close()


def rule(url: str, phase: str = "pre", id_: str = "pii", **extra: Any) -> GuardrailRule:
    return GuardrailRule.from_wire({"id": id_, "phase": phase, "url": url, **extra})


async def test_allow_is_noted_with_the_first_guardrail_and_its_time(url, guardrails) -> None:
    note = GuardNote()
    await guardrails.pre([rule(f"{url}/slow", id_="first"), rule(f"{url}/allow", id_="second")], "r1", "m1", BODY, note)
    fields = note.fields()
    took = fields.pop("guard_ms")
    assert fields == {"guard_action": "allow", "guard_policy": "first", "guard_rule": "pre"}
    assert isinstance(took, int) and 150 <= took < 2000  # the slow webhook's wait is counted


async def test_a_block_is_noted_before_the_refusal(url, guardrails) -> None:
    note = GuardNote()
    with pytest.raises(GuardrailBlocked):
        await guardrails.pre([rule(f"{url}/allow", id_="fine"), rule(f"{url}/block")], "r2", "m1", BODY, note)
    assert (note.action, note.policy, note.rule, note.category) == ("block", "pii", "pre", "contains a card number")


async def test_a_rewrite_outranks_allow_and_a_later_failure_open(url, guardrails) -> None:
    note = GuardNote()
    rules = [
        rule(f"{url}/allow", id_="fine"),
        rule(f"{url}/redact", id_="redact"),
        rule(f"{url}/error", id_="flaky", failOpen=True),
    ]
    await guardrails.pre(rules, "r3", "m1", BODY, note)
    assert (note.action, note.policy, note.rule, note.category) == (
        "rewrite",
        "redact",
        "pre",
        "redacted a card number",
    )


async def test_a_failure_open_outranks_allow_and_says_what_went_wrong(url, guardrails) -> None:
    note = GuardNote()
    await guardrails.pre(
        [rule(f"{url}/error", id_="flaky", failOpen=True), rule(f"{url}/allow")], "r4", "m1", BODY, note
    )
    assert (note.action, note.policy, note.category) == ("failed_open", "flaky", "it answered HTTP 500")


async def test_a_closed_failure_is_noted_as_unavailable(url, guardrails) -> None:
    note = GuardNote()
    with pytest.raises(GuardrailUnavailable):
        await guardrails.pre([rule(f"{url}/error", id_="strict")], "r5", "m1", BODY, note)
    assert (note.action, note.policy, note.rule, note.category) == (
        "unavailable",
        "strict",
        "pre",
        "it answered HTTP 500",
    )


async def test_pre_and_post_share_one_note_and_the_post_block_decides(url, guardrails) -> None:
    note = GuardNote()
    await guardrails.pre([rule(f"{url}/redact")], "r6", "m1", BODY, note)
    await guardrails.post([rule(f"{url}/redact", phase="post", id_="answers")], "r6", "m1", BODY, ANSWER, note)
    assert (note.action, note.policy, note.rule) == ("rewrite", "pii", "pre")  # a tie: the first to rewrite
    with pytest.raises(GuardrailBlocked):
        await guardrails.post([rule(f"{url}/long-block", phase="post", id_="answers")], "r6", "m1", BODY, ANSWER, note)
    assert (note.action, note.policy, note.rule) == ("block", "answers", "post")
    assert note.category == "x" * MAX_GUARD_CATEGORY


async def test_no_rule_consulted_leaves_no_fields(guardrails) -> None:
    note = GuardNote()
    await guardrails.pre([rule("http://127.0.0.1:9/never", phase="logging_only")], "r7", "m1", BODY, note)
    await guardrails.post([], "r7", "m1", BODY, ANSWER, note)
    assert note.fields() == {}


class Recorder:
    """Where the exchange's rows go (``opod.gateway.meter.UsageRecorder``): it keeps each end."""

    def __init__(self) -> None:
        self.ends: list[dict[str, Any]] = []

    def begin(self, **start: Any) -> UsageTicket:
        return UsageTicket("e", start["request_id"], "", "", start["model"], start["protocol"], 0)

    def end(self, ticket: UsageTicket, **ended: Any) -> None:
        self.ends.append(ended)

    def progress(self, ticket: UsageTicket, **progress: Any) -> None:
        pass


def held_exchange() -> tuple[Exchange, Recorder]:
    recorder = Recorder()
    exchange = Exchange(Meter(recorder), "r", "openai.chat.completions", probe=False, access_log=False)
    exchange.parsed("m1", {"model": "m1"})
    exchange.guarded()
    exchange.relaying(hold=True)
    exchange.ended(Outcome(200, "ok", "n1", {"prompt_tokens": 5, "completion_tokens": 3}))
    return exchange, recorder


@pytest.mark.parametrize(
    "then, status, outcome",
    [
        (lambda e: e.let_through(), 200, "ok"),
        (lambda e: e.refused(400), 400, "error"),
        (lambda e: e.abandoned(asyncio.CancelledError()), 499, "cancelled"),
    ],
)
def test_an_answer_held_for_the_post_guardrails_is_recorded_once_with_what_the_client_got(
    then, status, outcome
) -> None:
    exchange, recorder = held_exchange()
    assert recorder.ends == []  # the engine has answered; the guardrails have not yet
    then(exchange)
    exchange.refused(503)  # a later refusal changes nothing
    assert [(e["details"]["status"], e["outcome"], e["completion_tokens"]) for e in recorder.ends] == [
        (status, outcome, 3)
    ]
