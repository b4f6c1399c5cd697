"""Nothing escapes the meter, on ``opod up`` with the real llama-server (SmolLM2-135M-Instruct, four slots) and the
real embedding model (all-MiniLM-L6-v2).

A client that hangs up on a whole answer stops the engine's work, and its usage row says ``cancelled`` with what the
engine spent; a list of prompts is billed and reserved as the sum of its prompts; and no request spends more on its
prompt than its budget reservation held, the chat template's tokens included.

What a request is reserved for is read where a client reads it: the 429 of a project whose budget is 0 says "this
request could cost up to N" micros. At an input price of 1 and an output price of 1,000 per million tokens, N is the
reserved prompt tokens plus 1,000 × the reserved completion tokens.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from pathlib import Path

import openai
import pytest

from tests.support.opod_process import Leader, usage_rows, wait_until

pytestmark = pytest.mark.engine

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
ENDLESS = [{"role": "user", "content": "Write an endless story"}]
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "Dear diary, today", "In the beginning"]
INPUTS = ["The sea is calm tonight.", "A cat sat on the mat.", "Prices rose again in March."]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    home: Path = tmp_path_factory.mktemp("metering") / "home"
    leader = Leader(home)
    try:
        leader.wait_served(CHAT, EMBED, timeout=150)
        for path, body in (
            ("/api/v1/orgs", {"name": "acme"}),
            ("/api/v1/teams", {"name": "ml", "in": "acme"}),
            ("/api/v1/projects", {"name": "probe", "in": "acme/ml"}),
        ):
            status, answer = leader.admin("POST", path, body)
            assert status == 201, answer
        settings = (
            "prices:\n  '*': {input_per_million: 1, output_per_million: 1000}\n"
            "budgets:\n  - scope: project:acme/ml/probe\n    period: month\n    micros: 0\n"
        )
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": settings})
        assert status == 200, answer
        yield leader
    finally:
        if leader.process.proc.poll() is None:
            leader.process.stop()


@pytest.fixture(scope="module")
def client(up: Leader) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.url + "/v1", api_key=up.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def probe(up: Leader) -> openai.OpenAI:
    """A client whose project has a budget of 0: every request is refused, saying what it was reserved for."""
    status, key = up.admin("POST", "/api/v1/keys", {"name": "probe", "project": "acme/ml/probe"})
    assert status == 201 and isinstance(key, dict), key
    return openai.OpenAI(base_url=up.url + "/v1", api_key=key["secret"], max_retries=0, timeout=60)


def reserved(call) -> tuple[int, int]:
    """(prompt tokens, completion tokens) a request was reserved for, from its 429 on the probe project."""
    with pytest.raises(openai.RateLimitError) as refused:
        call()
    found = re.search(r"could cost up to (\d+)", str(refused.value))
    assert found, str(refused.value)
    micros = int(found.group(1))
    return micros % 1000, micros // 1000


def row(up: Leader, request_id: str):
    return wait_until(
        lambda: next((e.data for e in usage_rows(up) if e.data.request_id == request_id), None),
        30,
        f"the usage row of {request_id}",
    )


def hang_up_after(up: Leader, seconds: float, request_id: str, body: dict) -> None:
    """POST a chat and hang up after ``seconds`` without an answer, as ``curl -m`` does."""
    conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=seconds)
    headers = {"Authorization": f"Bearer {up.key}", "Content-Type": "application/json", "X-Request-Id": request_id}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()


def test_four_whole_answers_whose_clients_hang_up_free_the_four_slots_and_are_billed_as_cancelled(
    up: Leader, client: openai.OpenAI
) -> None:
    # One answer of the model first: its rate is what an answer never returned is estimated by.
    taught = client.chat.completions.create(model=CHAT, messages=ENDLESS, max_tokens=16)
    # No max_tokens: the settings' bound, 4,096 here; and no end of its own (llama-server's ignore_eos), so no answer
    # ends before its client hangs up, however short a story the model would have told.
    body = {"model": CHAT, "messages": ENDLESS, "ignore_eos": True}
    callers = [threading.Thread(target=hang_up_after, args=(up, 2.0, f"dropped-{i}", body)) for i in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()

    started = time.monotonic()
    answer = client.with_options(timeout=30).chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    took = time.monotonic() - started
    # Had the engine gone on with the four, its four slots would be busy for minutes.
    assert answer.choices[0].message.content and took < 15, took

    for i in range(4):
        dropped = row(up, f"dropped-{i}")
        assert dropped.outcome == "cancelled", dropped
        assert dropped.prompt_tokens == taught.usage.prompt_tokens, dropped  # counted with the template
        assert 0 < dropped.completion_tokens < 4096, dropped
        assert (dropped.route or {}).get("completion_tokens") == "estimated"


def test_a_list_of_prompts_is_billed_and_reserved_as_the_sum_of_its_prompts(
    up: Leader, client: openai.OpenAI, probe: openai.OpenAI
) -> None:
    alone = [client.completions.create(model=CHAT, prompt=p, max_tokens=6, temperature=0) for p in PROMPTS]
    raw = client.completions.with_raw_response.create(
        model=CHAT, prompt=PROMPTS, max_tokens=6, temperature=0, extra_headers={"X-Request-Id": "listed"}
    )
    listed = raw.parse()
    assert [c.index for c in listed.choices] == list(range(len(PROMPTS)))
    assert [c.text for c in listed.choices] == [a.choices[0].text for a in alone]
    assert listed.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert listed.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    billed = row(up, "listed")
    assert (billed.prompt_tokens, billed.completion_tokens) == (
        listed.usage.prompt_tokens,
        listed.usage.completion_tokens,
    )

    # Streamed, each prompt's usage counts too.
    stream = client.completions.create(
        model=CHAT,
        prompt=PROMPTS,
        max_tokens=6,
        temperature=0,
        stream=True,
        extra_headers={"X-Request-Id": "listed-stream"},
    )
    assert len({chunk.choices[0].index for chunk in stream if chunk.choices}) == len(PROMPTS)
    streamed = row(up, "listed-stream")
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (
        listed.usage.prompt_tokens,
        listed.usage.completion_tokens,
    )

    # Reserved: each prompt's bound and each prompt's max_tokens.
    each = [reserved(lambda p=p: probe.completions.create(model=CHAT, prompt=p, max_tokens=6)) for p in PROMPTS]
    whole = reserved(lambda: probe.completions.create(model=CHAT, prompt=PROMPTS, max_tokens=6))
    assert whole == (sum(p for p, _ in each), 6 * len(PROMPTS))
    assert all(p >= a.usage.prompt_tokens for (p, _), a in zip(each, alone, strict=True))


def test_a_list_of_inputs_to_embed_is_billed_and_reserved_as_the_sum_of_its_inputs(
    up: Leader, client: openai.OpenAI, probe: openai.OpenAI
) -> None:
    alone = [client.embeddings.create(model=EMBED, input=text) for text in INPUTS]
    listed = client.embeddings.with_raw_response.create(
        model=EMBED, input=INPUTS, extra_headers={"X-Request-Id": "embedded"}
    ).parse()
    assert len(listed.data) == len(INPUTS)
    assert row(up, "embedded").prompt_tokens == listed.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)

    each = [reserved(lambda t=t: probe.embeddings.create(model=EMBED, input=t)) for t in INPUTS]
    whole = reserved(lambda: probe.embeddings.create(model=EMBED, input=INPUTS))
    assert whole == (sum(p for p, _ in each), 0)
    assert all(p >= a.usage.prompt_tokens for (p, _), a in zip(each, alone, strict=True))


@pytest.mark.parametrize("text", ["Hi", "Write a haiku about the sea, please.", "¿Qué hora es? 今何時ですか"])
def test_no_chat_spends_more_on_its_prompt_than_it_reserved_the_template_included(
    client: openai.OpenAI, probe: openai.OpenAI, text: str
) -> None:
    messages = [{"role": "user", "content": text}]
    prompt, completion = reserved(lambda: probe.chat.completions.create(model=CHAT, messages=messages, max_tokens=5))
    used = client.chat.completions.create(model=CHAT, messages=messages, max_tokens=5).usage
    # SmolLM2's template adds a default system prompt of its own: far more tokens than "Hi" is bytes.
    assert used.prompt_tokens <= prompt and completion == 5, (used, prompt)

    prompt, completion = reserved(lambda: probe.responses.create(model=CHAT, input=text, max_output_tokens=5))
    used_r = client.responses.create(model=CHAT, input=text, max_output_tokens=5).usage
    assert used_r.input_tokens <= prompt and completion == 5, (used_r, prompt)


def test_a_chat_without_max_tokens_is_reserved_for_the_settings_bound(probe: openai.OpenAI) -> None:
    _, completion = reserved(lambda: probe.chat.completions.create(model=CHAT, messages=ENDLESS))
    assert completion == 4096  # generation.default_max_tokens, and what the engine is told
