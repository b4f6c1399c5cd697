"""The real ``openai`` package against ``opod up`` with a simulator worker: bad requests are refused at the edge.

Each invalid request gets a 400 in OpenAI's error shape naming the field, which the client raises as
``openai.BadRequestError`` and never retries; a model asked for work it does not do answers 400, not 501;
every ``/v1`` path answers OpenAI's shape (404, 405 with ``Allow``); ``models.retrieve`` finds a model.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from opod.catalog import bundled_dir
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, opod_cli, sim_worker, wait_until

CHAT, EMBED, LONG = "edge-chat", "edge-embed", "edge-long"
CHAT_CONTEXT, EMBED_CONTEXT = 4096, 512
LONG_CATALOG, LONG_SERVED = 131072, 8192
"""The catalog states 128K; a CPU worker starts the engine with 8,192 tokens a request."""
HELLO = [{"role": "user", "content": "Hello"}]


def _catalog_entry(home: Path, model_id: str, capabilities: list[str], context: int) -> None:
    """A simulated model in the leader's own catalog, with only the capabilities and context given."""
    body = yaml.safe_load((bundled_dir() / "qwen2.5-0.5b-gguf.yaml").read_text())
    body.update(
        id=model_id,
        display_name=model_id,
        source={"type": "file", "path": "/simulated"},
        capabilities=capabilities,
        context_window=context,
    )
    (home / "catalog").mkdir(parents=True, exist_ok=True)
    (home / "catalog" / f"{model_id}.yaml").write_text(yaml.safe_dump(body))


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("edge")
    home = root / "leader"
    _catalog_entry(home, CHAT, ["chat"], CHAT_CONTEXT)
    _catalog_entry(home, EMBED, ["embedding"], EMBED_CONTEXT)
    _catalog_entry(home, LONG, ["chat"], LONG_CATALOG)
    up = Leader(home)
    worker = sim_worker(up, root / "worker", "n_edge")
    worker.wait_for_line("registered with", timeout=30)
    for model in (CHAT, EMBED, LONG):
        added = opod_cli(up, "model", "add", model, "--engine", "sim")
        assert added.returncode == 0, added.stderr
    wait_until(lambda: {CHAT, EMBED, LONG} <= up.served(), 60, "the models served")
    yield up
    worker.stop()
    up.stop()


class Sent:
    """Every HTTP request the client sends, so a retry would show."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, request: httpx.Request) -> None:
        self.count += 1


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def client(leader: Leader, sent: Sent):
    # Retries on: a refusal the client took for a server error would be sent again, and counted.
    http_client = httpx.Client(event_hooks={"request": [sent]}, timeout=30)
    yield openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=2, http_client=http_client)
    http_client.close()


def _refused(sent: Sent, call, param: str) -> openai.BadRequestError:
    before = sent.count
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert sent.count - before == 1, "the client retried the refusal"
    error = caught.value
    assert error.status_code == 400 and isinstance(error.body, dict)
    assert set(error.body) >= {"message", "type", "param", "code"}, error.body
    assert error.body["param"] == param, error.body
    return error


INVALID_CHATS = [
    ("messages", {"messages": []}),
    ("messages[0].role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("max_tokens", {"messages": HELLO, "max_tokens": 0}),
    ("temperature", {"messages": HELLO, "temperature": -3}),
    ("top_p", {"messages": HELLO, "top_p": 1.5}),
    ("presence_penalty", {"messages": HELLO, "presence_penalty": 9}),
    ("n", {"messages": HELLO, "n": 0}),
    ("stop", {"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}),
    ("model", {"model": "", "messages": HELLO}),
    (
        "messages[0].content[0].type",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
                }
            ]
        },
    ),
    (
        "tools",
        {
            "messages": HELLO,
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
        },
    ),
]


@pytest.mark.parametrize(("param", "fields"), INVALID_CHATS, ids=[p for p, _ in INVALID_CHATS])
def test_an_invalid_chat_is_a_400_naming_the_field_and_never_retried(
    client: openai.OpenAI, sent: Sent, param: str, fields: dict
) -> None:
    error = _refused(sent, lambda: client.chat.completions.create(**{"model": CHAT, **fields}), param)
    assert param.split("[")[0].split(".")[0] in error.message


def test_a_missing_or_null_model_is_a_400_naming_model(leader: Leader) -> None:
    for body in ({"messages": HELLO}, {"model": None, "messages": HELLO}):
        status, _, answer = http("POST", leader.url + "/v1/chat/completions", body, key=leader.key)
        assert status == 400 and answer["error"]["param"] == "model", answer


def test_a_body_that_is_not_sent_as_json_is_a_400_saying_what_to_send(leader: Leader) -> None:
    body = json.dumps({"model": CHAT, "messages": HELLO}).encode()
    request = urllib.request.Request(
        leader.url + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {leader.key}", "Content-Type": "text/plain"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    answer = json.loads(caught.value.read())
    assert caught.value.code == 400 and "application/json" in answer["error"]["message"], answer


def test_a_prompt_far_over_the_context_is_refused_at_once_with_the_limit(client: openai.OpenAI, sent: Sent) -> None:
    started = time.monotonic()
    error = _refused(
        sent,
        lambda: client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "lorem ipsum " * ((20 << 20) // 12)}], max_tokens=4
        ),
        "messages",
    )
    assert time.monotonic() - started < 5
    assert error.code == "context_length_exceeded" and str(CHAT_CONTEXT) in error.message


def test_embeddings_input_over_the_context_is_refused_with_the_limit(client: openai.OpenAI, sent: Sent) -> None:
    error = _refused(sent, lambda: client.embeddings.create(model=EMBED, input=["fine", "hello " * 600]), "input")
    assert error.code == "context_length_exceeded" and str(EMBED_CONTEXT) in error.message
    _refused(sent, lambda: client.embeddings.create(model=EMBED, input=""), "input")
    assert client.embeddings.create(model=EMBED, input=["hello", "world"]).data


def test_a_model_asked_for_work_it_does_not_do_answers_400_never_501(
    leader: Leader, client: openai.OpenAI, sent: Sent
) -> None:
    error = _refused(sent, lambda: client.embeddings.create(model=CHAT, input="x"), "model")
    assert error.code == "embeddings_not_supported"
    error = _refused(sent, lambda: client.chat.completions.create(model=EMBED, messages=HELLO), "model")
    assert error.code == "chat_not_supported"
    status, _, body = http(
        "POST", leader.url + "/v1/rerank", {"model": CHAT, "query": "q", "documents": ["a"]}, key=leader.key
    )
    assert status == 400 and body["error"]["code"] == "rerank_not_supported", body


def test_refusals_leave_the_models_serving(leader: Leader, client: openai.OpenAI) -> None:
    for _ in range(5):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=CHAT,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}],
                    }
                ],
            )
    assert client.chat.completions.create(model=CHAT, messages=HELLO, max_tokens=3).choices
    assert client.embeddings.create(model=EMBED, input="hi").data
    status, _, body = http("GET", leader.url + "/readyz")
    assert status == 200 and body["ready"] is True


def test_models_retrieve_finds_a_served_model_and_404s_in_openai_shape(client: openai.OpenAI) -> None:
    model = client.models.retrieve(CHAT)
    assert model.id == CHAT and model.object == "model"
    assert model.model_extra and model.model_extra["max_model_len"] == CHAT_CONTEXT
    listed = {m.id: m for m in client.models.list()}
    assert listed[EMBED].model_extra and listed[EMBED].model_extra["max_model_len"] == EMBED_CONTEXT
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


def test_every_v1_path_answers_openai_error_shape(leader: Leader) -> None:
    status, _, body = http("POST", leader.url + "/v1/no/such/route", {"x": 1}, key=leader.key)
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "/v1/chat/completions" in body["error"]["message"]
    status, headers, body = http("GET", leader.url + "/v1/chat/completions", key=leader.key)
    assert status == 405 and headers["allow"] == "POST" and body["error"]["code"] == "method_not_allowed", body
    status, headers, body = http("DELETE", leader.url + "/v1/models", key=leader.key)
    assert status == 405 and headers["allow"] == "GET" and "error" in body, body
    status, headers, body = http("POST", leader.url + "/v1/models/" + CHAT, {}, key=leader.key)
    assert status == 405 and headers["allow"] == "GET", body


def test_a_model_served_with_less_than_its_catalog_window_says_and_enforces_the_real_limit(
    leader: Leader, client, sent
) -> None:
    assert client.models.retrieve(LONG).model_extra["max_model_len"] == LONG_SERVED
    words = " ".join(f"w{i % 10}" for i in range(LONG_SERVED + 500))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=LONG, messages=[{"role": "user", "content": words}], max_tokens=1)
    assert refused.value.code == "context_length_exceeded" and str(LONG_SERVED) in refused.value.message
    assert sent.count == 2, "a refusal is not retried"
