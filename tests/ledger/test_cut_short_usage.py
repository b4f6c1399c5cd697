"""The usage row of a stream that ended before the engine's usage chunk: the tokens streamed, and its prompt counted.

The gateway's bookkeeping (:class:`opod.gateway.exchange.Exchange`) is driven as the relay drives it,
onto a real ledger and store; the worker's tokenizer is a plain function that answers as the worker's
``/v1/tokenize`` would (or fails as a worker whose engine is down does).
"""

from __future__ import annotations

import asyncio
import json

from opod.gateway.exchange import Exchange
from opod.gateway.meter import Meter
from opod.gateway.outcome import Outcome
from opod.gateway.usagecount import DecodeRates, PromptCounter, estimate
from opod.http.nodeclient import WorkerUnavailable
from opod.ledger import Ledger
from opod.store import Store

PAYLOAD = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a long answer, please"}]},
    ],
}


def stream(ledger: Ledger, prompts: PromptCounter | None, request_id: str, outcome: Outcome) -> Exchange:
    exchange = Exchange(Meter(ledger, prompts=prompts), request_id, "openai.chat.completions", False, False)
    exchange.parsed("m", PAYLOAD)
    exchange.relaying()
    exchange.sent()
    exchange.ended(outcome)
    return exchange


async def rows(ledger: Ledger, store: Store, prompts: PromptCounter) -> dict:
    await prompts.settle()
    await ledger.flush()
    return {row.request_id: row for row in store.usage_after(0, 100)}


async def test_a_stream_its_client_left_records_the_tokens_streamed_and_its_prompt_counted(
    ledger: Ledger, store: Store
) -> None:
    asked: list[tuple[str, list[tuple[str, str]]]] = []

    async def tokenize(node_id, request):
        asked.append((node_id, [(m.role, m.content) for m in request.messages]))
        return list(range(17))

    prompts = PromptCounter(tokenize)
    stream(ledger, prompts, "left", Outcome(499, "cancelled", "n1", None, 40, tokens_sent=3))
    found = await rows(ledger, store, prompts)
    row = found["left"]
    assert (row.outcome, row.prompt_tokens, row.completion_tokens, row.node_id) == ("cancelled", 17, 3, "n1")
    assert json.loads(row.route_json)["prompt_tokens"] == "counted"
    assert asked == [("n1", [("system", "Be brief."), ("user", "a long answer, please")])]


async def test_a_stream_whose_engine_died_carries_an_estimate_when_its_worker_cannot_count(
    ledger: Ledger, store: Store
) -> None:
    async def tokenize(node_id, request):
        raise WorkerUnavailable("the engine is restarting")

    prompts = PromptCounter(tokenize)
    stream(ledger, prompts, "cut", Outcome(502, "error", "n1", None, 40, tokens_sent=5))
    row = (await rows(ledger, store, prompts))["cut"]
    assert (row.outcome, row.completion_tokens) == ("error", 5)
    assert row.prompt_tokens == estimate(PAYLOAD) > 0
    assert json.loads(row.route_json)["prompt_tokens"] == "estimated"


async def test_an_answer_with_the_engines_usage_is_recorded_at_once_and_never_counted_again(
    ledger: Ledger, store: Store
) -> None:
    async def tokenize(node_id, request):
        raise AssertionError("an answer with usage must not be counted again")

    prompts = PromptCounter(tokenize)
    usage = {"prompt_tokens": 9, "completion_tokens": 4}
    stream(ledger, prompts, "whole", Outcome(200, "ok", "n1", usage, 40, tokens_sent=4))
    stream(ledger, prompts, "left-late", Outcome(499, "cancelled", "n1", usage, 40, tokens_sent=4))
    assert ledger.in_flight == 0  # both rows ended on the spot
    found = await rows(ledger, store, prompts)
    assert [(found[r].prompt_tokens, found[r].completion_tokens) for r in ("whole", "left-late")] == [(9, 4), (9, 4)]


async def test_a_whole_answer_its_client_left_is_cancelled_with_the_tokens_its_time_at_the_engine_stands_for(
    ledger: Ledger, store: Store
) -> None:
    async def tokenize(node_id, request):
        return list(range(17))

    prompts = PromptCounter(tokenize)
    rates = DecodeRates()
    rates.learn("m", 40, 2.0)  # an answer seen before: 20 tokens a second
    exchange = Exchange(Meter(ledger, prompts=prompts, rates=rates), "left", "openai.chat.completions", False, False)
    exchange.parsed("m", PAYLOAD)
    exchange.capped(100)
    exchange.relaying()
    exchange.routed({"worker": "n1", "reason": "least-loaded"})
    exchange.sent()
    exchange.sent_at -= 3.0  # the engine has worked on it for three seconds
    exchange.abandoned(asyncio.CancelledError())
    row = (await rows(ledger, store, prompts))["left"]
    assert (row.outcome, row.prompt_tokens, row.node_id) == ("cancelled", 17, "n1")
    assert 60 <= row.completion_tokens <= 61
    route = json.loads(row.route_json)
    assert (route["completion_tokens"], route["prompt_tokens"]) == ("estimated", "counted")
    assert exchange.meter.stats.in_flight == 0


async def test_the_estimate_never_passes_what_the_request_could_make_and_a_prompt_counted_on_the_way_is_kept(
    ledger: Ledger, store: Store
) -> None:
    async def tokenize(node_id, request):
        raise AssertionError("the prompt was counted already")

    prompts = PromptCounter(tokenize)
    rates = DecodeRates()
    rates.learn("m", 100, 1.0)
    exchange = Exchange(Meter(ledger, prompts=prompts, rates=rates), "capped", "openai.chat.completions", False, False)
    exchange.parsed("m", PAYLOAD)
    exchange.counted(23)
    exchange.capped(8)
    exchange.relaying()
    exchange.sent()
    exchange.sent_at -= 5.0
    exchange.abandoned(asyncio.CancelledError())
    row = (await rows(ledger, store, prompts))["capped"]
    assert (row.outcome, row.prompt_tokens, row.completion_tokens) == ("cancelled", 23, 8)


async def test_a_request_left_before_any_engine_had_it_is_cancelled_with_nothing_spent(
    ledger: Ledger, store: Store
) -> None:
    prompts = PromptCounter(lambda node_id, request: None)  # type: ignore[arg-type, return-value]
    exchange = Exchange(Meter(ledger, prompts=prompts), "queued", "openai.chat.completions", False, False)
    exchange.parsed("m", PAYLOAD)
    exchange.abandoned(asyncio.CancelledError())
    row = (await rows(ledger, store, prompts))["queued"]
    assert (row.outcome, row.prompt_tokens, row.completion_tokens) == ("cancelled", 0, 0)
