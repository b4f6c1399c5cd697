"""``opod up`` on a fresh home serves the real CPU defaults to the real ``openai`` client.

llama.cpp's llama-server with SmolLM2-135M-Instruct for chat and all-MiniLM-L6-v2
(converted to GGUF by opod) for embeddings; nothing comes from a model hub.
"""

from __future__ import annotations

import json
import math
import stat
import time
import urllib.error
import urllib.request

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
    answer = client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16
    )
    assert up.ready_after < 60, f"serving took {up.ready_after:.0f}s"
    assert answer.choices[0].message.content.strip()


def test_non_streamed_chat_with_usage_and_request_id(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    assert raw.headers["x-request-id"]
    answer = raw.parse()
    assert answer.model == CHAT
    text = answer.choices[0].message.content
    assert isinstance(text, str) and len(text.split()) >= 2
    assert answer.usage.prompt_tokens > 5 and answer.usage.completion_tokens > 0


def test_streamed_chat_with_include_usage_ends_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert not chunks[-1].choices


def test_streamed_chat_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    )
    assert chunks and all(c.choices for c in chunks)
    assert all(getattr(c, "usage", None) is None for c in chunks)


def test_unknown_fields_and_logprobs_pass_through_to_the_engine(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body={"top_k": 1, "cache_prompt": True},
    )
    assert answer.choices[0].logprobs is not None
    assert answer.choices[0].logprobs.content and answer.choices[0].logprobs.content[0].top_logprobs


def test_response_format_reaches_the_engine(client: openai.OpenAI) -> None:
    import json

    answer = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Give a JSON object with a key name."}],
        max_tokens=40,
        response_format={"type": "json_object"},
        temperature=0,
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
    status, headers, body = http(
        "POST", up.url + "/v1/rerank", {"model": CHAT, "query": "q", "documents": ["a"]}, key=up.key
    )
    assert status == 400 and body["error"]["code"] == "rerank_not_supported" and headers["x-request-id"]
    status, _, body = http("POST", up.url + "/v1/embeddings", {"model": CHAT, "input": "x"}, key=up.key)
    assert status == 400 and body["error"]["code"] == "embeddings_not_supported"
    with pytest.raises(openai.BadRequestError) as chat_on_embed:
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "x"}])
    assert chat_on_embed.value.code == "chat_not_supported"
    with pytest.raises(openai.NotFoundError) as retrieved:
        client.models.retrieve("no-such-model")
    assert retrieved.value.code == "model_not_found"
    assert client.models.retrieve(CHAT).id == CHAT
    status, headers, body = http("GET", up.url + "/v1/chat/completions", key=up.key)
    assert status == 405 and headers["allow"] == "POST" and set(body["error"]) == {"message", "type", "param", "code"}
    status, _, body = http("GET", up.url + "/v1/no-such-route", key=up.key)
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}


IMAGE = [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
]
INVALID = [
    ("messages", {"messages": []}),
    ("messages[0].role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("max_tokens", {"max_tokens": 0}),
    ("temperature", {"temperature": -3}),
    ("model", {"model": None}),
    ("model", {"model": ""}),
    ("messages[0].content[0].type", {"messages": IMAGE}),
    ("messages", {"messages": [{"role": "user", "content": "lorem ipsum " * ((20 << 20) // 12)}]}),
]


@pytest.mark.parametrize(("param", "fields"), INVALID, ids=[f"{p}-{i}" for i, (p, _) in enumerate(INVALID)])
def test_invalid_requests_are_refused_before_the_engine_with_a_400_naming_the_field(
    up: Leader, param: str, fields: dict
) -> None:
    started = time.monotonic()
    body = {"model": CHAT, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, **fields}
    status, _, answer = http("POST", up.url + "/v1/chat/completions", body, key=up.key)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert time.monotonic() - started < 5, "refused only after the engine tokenised it"


def test_a_text_plain_body_and_bad_embeddings_are_refused_and_the_models_keep_serving(
    up: Leader, client: openai.OpenAI
) -> None:
    data = b'{"model": "%s", "messages": [{"role": "user", "content": "x"}]}' % CHAT.encode()
    request = urllib.request.Request(
        up.url + "/v1/chat/completions",
        data=data,
        method="POST",
        headers={"Authorization": f"Bearer {up.key}", "Content-Type": "text/plain"},
    )
    with pytest.raises(urllib.error.HTTPError) as plain:
        urllib.request.urlopen(request, timeout=30)
    assert plain.value.code == 400 and "application/json" in json.loads(plain.value.read())["error"]["message"]
    for _ in range(3):
        with pytest.raises(openai.BadRequestError) as long_input:
            client.embeddings.create(model=EMBED, input="hello " * 600)
        assert long_input.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=CHAT, messages=IMAGE, max_tokens=3)
    assert client.embeddings.create(model=EMBED, input="hi").data
    assert client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    ).choices
    assert http("GET", up.url + "/readyz")[0] == 200


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
