"""The OpenAI API as the real ``openai`` client sees it, over real HTTP."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest


def client(handle) -> openai.OpenAI:
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_every_served_name(sim) -> None:
    h = sim(models=("alpha", "beta"))
    assert [m.id for m in client(h).models.list().data] == ["alpha", "beta"]


def test_chat_non_streamed_answers_with_usage_and_cached_tokens(sim) -> None:
    h = sim()
    c = client(h)
    r = c.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "Hello there, simulator!"}], max_tokens=7
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 7
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_max_tokens_caps_the_answer_and_says_length(sim) -> None:
    h = sim(output_min=50, output_max=60)
    c = client(h)
    r = c.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "Talk."}], max_completion_tokens=3
    )
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (3, "length")
    r = c.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "Talk."}], max_tokens=500)
    assert r.choices[0].finish_reason == "stop" and 50 <= r.usage.completion_tokens <= 60


def test_chat_streamed_with_include_usage_ends_with_a_usage_chunk_then_done(sim) -> None:
    h = sim()
    c = client(h)
    stream = c.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "Stream please"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["length"] or finals == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        [ch for ch in chunks[1:] if ch.choices]
    )
    raw = httpx.post(
        h.url + "/v1/chat/completions",
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    records = [line for line in raw.text.split("\n\n") if line]
    assert records[-1] == "data: [DONE]"
    usage = json.loads(records[-2][len("data: ") :])
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_stream_without_include_usage_has_no_usage_chunk(sim) -> None:
    h = sim()
    raw = httpx.post(
        h.url + "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True},
    )
    bodies = [json.loads(r[6:]) for r in raw.text.split("\n\n") if r and r != "data: [DONE]"]
    assert all(b["choices"] for b in bodies)
    assert raw.text.endswith("data: [DONE]\n\n")


def test_text_completions_streamed_and_not(sim) -> None:
    h = sim()
    c = client(h)
    r = c.completions.create(model="sim-model", prompt="Once upon a time", max_tokens=5)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 5
    chunks = list(
        c.completions.create(
            model="sim-model",
            prompt="Once upon a time",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    by_ids = c.completions.create(model="sim-model", prompt=[300, 301, 302], max_tokens=2)
    assert by_ids.usage.prompt_tokens == 3


def test_n_above_one_is_a_400_on_an_engine_that_answers_one_choice(sim) -> None:
    h = sim(dialect="llamacpp")
    with pytest.raises(openai.BadRequestError) as err:
        client(h).chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}], n=2)
    assert err.value.status_code == 400
    assert "n=1" in err.value.body["message"]


def test_unknown_model_is_404_model_not_found(sim) -> None:
    h = sim()
    with pytest.raises(openai.NotFoundError) as err:
        client(h).chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_found"
    body = httpx.post(h.url + "/v1/completions", json={"model": "nope", "prompt": "x"}).json()
    assert body["error"]["code"] == "model_not_found" and "nope" in body["error"]["message"] and body["error"]["type"]


def test_unknown_fields_are_accepted_and_bad_ones_named(sim) -> None:
    h = sim()
    ok = httpx.post(
        h.url + "/v1/chat/completions",
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "vllm_xargs": {"a": 1},
            "cache_salt": "t",
            "something_new": [1, 2],
            "top_k": 5,
        },
    )
    assert ok.status_code == 200
    bad = httpx.post(
        h.url + "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    missing = httpx.post(h.url + "/v1/chat/completions", json={"model": "sim-model"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    broken = httpx.post(
        h.url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400 and "JSON" in broken.json()["error"]["message"]


def test_prompt_longer_than_the_context_is_refused(sim) -> None:
    h = sim(max_model_len=64)
    r = httpx.post(h.url + "/v1/completions", json={"model": "sim-model", "prompt": "word " * 100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_tokens"


def test_embeddings_are_deterministic_unit_vectors_of_the_configured_dimension(sim) -> None:
    h = sim(embedding_dim=64)
    c = client(h)
    r = c.embeddings.create(model="sim-model", input=["the quick brown fox", "another text"])
    a, b = (np.array(d.embedding) for d in r.data)
    assert a.shape == (64,) and abs(np.linalg.norm(a) - 1) < 1e-5
    assert not np.allclose(a, b)
    assert r.usage.prompt_tokens == 6
    again = c.embeddings.create(model="sim-model", input="the quick brown fox")
    assert np.allclose(again.data[0].embedding, a)
    small = c.embeddings.create(model="sim-model", input="x", dimensions=8)
    assert len(small.data[0].embedding) == 8
    as_b64 = c.embeddings.create(model="sim-model", input="the quick brown fox", encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(as_b64.data[0].embedding), dtype="<f4")
    assert np.allclose(decoded, a, atol=1e-6)


def test_unknown_path_answers_like_vllm(sim) -> None:
    h = sim()
    r = httpx.get(h.url + "/nope")
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
