"""``n`` > 1 on the simulator: n choices indexed 0..n-1, whole and streamed, for the engines that answer them."""

from __future__ import annotations

import httpx
import openai
import pytest

ASK = [{"role": "user", "content": "Say something."}]


def client(handle) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_n_choices_come_back_indexed_with_their_tokens_summed(sim, dialect) -> None:
    h = sim(dialect=dialect, output_min=4, output_max=12)
    c = client(h)
    r = c.chat.completions.create(model="sim-model", messages=ASK, n=3, max_tokens=50)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert all(ch.message.content for ch in r.choices)
    assert len({ch.message.content for ch in r.choices}) > 1, "the choices are drawn apart"
    single = c.chat.completions.create(model="sim-model", messages=ASK, max_tokens=50)
    assert r.choices[0].message.content == single.choices[0].message.content
    words = [len(client_tokens(ch.message.content)) for ch in r.choices]
    assert r.usage.completion_tokens == sum(words)


def client_tokens(text: str) -> list[str]:
    from opod.contract.tokenizer import Tokenizer

    return Tokenizer().pieces(text)


def test_streamed_n_choices_carry_each_choice_index_and_finish(sim) -> None:
    h = sim(output_min=3, output_max=9)
    stream = client(h).chat.completions.create(
        model="sim-model", messages=ASK, n=2, max_tokens=50, stream=True, stream_options={"include_usage": True}
    )
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    whole = client(h).chat.completions.create(model="sim-model", messages=ASK, n=2, max_tokens=50)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert set(finishes) == {0, 1}
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_text_completions_answer_n_choices(sim) -> None:
    h = sim()
    r = client(h).completions.create(model="sim-model", prompt="Once upon a time", n=2, max_tokens=5)
    assert [c.index for c in r.choices] == [0, 1]


@pytest.mark.parametrize("dialect", ["llamacpp"])
def test_an_engine_without_n_refuses_it_naming_the_field(sim, dialect) -> None:
    h = sim(dialect=dialect)
    r = httpx.post(h.url + "/v1/chat/completions", json={"model": "sim-model", "messages": ASK, "n": 2})
    assert r.status_code == 400 and "n=2" in r.json()["error"]["message"]


def test_n_over_the_limit_is_refused(sim) -> None:
    h = sim()
    r = httpx.post(h.url + "/v1/chat/completions", json={"model": "sim-model", "messages": ASK, "n": 129})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
