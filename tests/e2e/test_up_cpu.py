"""``opod up`` on a fresh home serves the real CPU defaults to the real ``openai`` client.

llama.cpp's llama-server with SmolLM2-135M-Instruct for chat and all-MiniLM-L6-v2
(converted to GGUF by opod) for embeddings; nothing comes from a model hub.
"""

from __future__ import annotations

import math
import stat
import time

import openai
import pytest

from tests.support.opod_process import Leader, alive, http

pytestmark = pytest.mark.engine

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("up") / "home"
    started = time.monotonic()
    leader = Leader(home)
    leader.wait_served(CHAT, EMBED, timeout=150)
    leader.ready_after = time.monotonic() - started
    yield leader
    if leader.process.proc.poll() is None:
        leader.process.stop()


@pytest.fixture(scope="module")
def client(up: Leader) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.url + "/v1", api_key=up.key, max_retries=0, timeout=60)


def test_first_start_prints_the_admin_key_once_and_keeps_it_private(up: Leader) -> None:
    key_file = up.home / "admin.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert up.key.startswith("sk-orc-")
    assert sum(up.key in line for line in up.process.lines) == 1


def test_a_chat_answer_arrives_within_a_minute_of_the_command(up: Leader, client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16)
    assert up.ready_after < 60, f"serving took {up.ready_after:.0f}s"
    assert answer.choices[0].message.content.strip()


def test_non_streamed_chat_with_usage_and_request_id(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=24, temperature=0
    )
    assert raw.headers["x-request-id"]
    answer = raw.parse()
    assert answer.model == CHAT
    text = answer.choices[0].message.content
    assert isinstance(text, str) and len(text.split()) >= 2
    assert answer.usage.prompt_tokens > 5 and answer.usage.completion_tokens > 0


def test_streamed_chat_with_include_usage_ends_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Count to five."}], max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert not chunks[-1].choices


def test_streamed_chat_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True))
    assert chunks and all(c.choices for c in chunks)
    assert all(getattr(c, "usage", None) is None for c in chunks)


def test_unknown_fields_and_logprobs_pass_through_to_the_engine(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, logprobs=True, top_logprobs=2,
        extra_body={"top_k": 1, "cache_prompt": True},
    )
    assert answer.choices[0].logprobs is not None
    assert answer.choices[0].logprobs.content and answer.choices[0].logprobs.content[0].top_logprobs


def test_response_format_reaches_the_engine(client: openai.OpenAI) -> None:
    import json

    answer = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Give a JSON object with a key name."}], max_tokens=40,
        response_format={"type": "json_object"}, temperature=0,
    )
    text = answer.choices[0].message.content
    try:
        json.loads(text)
    except ValueError:
        assert answer.choices[0].finish_reason == "length" and text.lstrip().startswith("{"), text


def test_text_completions(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=CHAT, prompt="The sky is", max_tokens=8)
    assert answer.choices[0].text.strip()


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_real_embeddings_from_minilm(client: openai.OpenAI) -> None:
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Interest rates rose sharply this quarter."]
    result = client.embeddings.create(model=EMBED, input=texts)
    vectors = [d.embedding for d in result.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in vectors)
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.2
    assert result.usage.prompt_tokens > 0


def test_models_lists_what_is_served(client: openai.OpenAI) -> None:
    assert {m.id for m in client.models.list()} >= {CHAT, EMBED}


def test_refusals_have_openai_shape_and_honest_codes(up: Leader, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    anonymous = openai.OpenAI(base_url=up.url + "/v1", api_key="sk-opod-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "x"}], n=2)
    assert many.value.code == "invalid_request" and "n=2" in str(many.value)
    status, headers, body = http("POST", up.url + "/v1/rerank", {"model": CHAT, "query": "q", "documents": ["a"]}, key=up.key)
    assert status == 501 and body["error"]["code"] == "rerank_not_supported" and headers["x-request-id"]
    status, _, body = http("POST", up.url + "/v1/embeddings", {"model": CHAT, "input": "x"}, key=up.key)
    assert status == 501 and body["error"]["code"] == "embeddings_not_supported"


def test_a_body_over_the_route_cap_is_refused_with_413(up: Leader) -> None:
    status, _, body = http("POST", up.url + "/v1/embeddings", {"model": EMBED, "input": "x" * (9 << 20)}, key=up.key)
    assert status == 413 and body["error"]["code"] == "request_too_large"


def test_ctrl_c_stops_engines_and_the_worker_cleanly(up: Leader) -> None:
    children = up.process.children()
    assert children, "the engines should be running under opod up"
    assert up.process.stop() == 0
    assert "stopped" in up.process.lines[-1]
    time.sleep(0.5)
    assert [pid for pid in children if alive(pid)] == []
