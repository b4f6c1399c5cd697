"""What a careless or hostile client sends a real leader, on ``/v1``, ``/api/v1`` and ``/admin/v1``.

No input gets a 500: JSON nested past the limit, text that cannot be encoded and lifetimes past any
date are each a 400 naming what is wrong. OpenAI's rules are kept rather than ignored: ``dimensions``
on embeddings, ``logit_bias``, the Responses API's own field names, a model's aliases. And nothing is
told to a stranger that only the operator should know: no path of the leader's, no line of an
engine's log, no whole echo of what was sent.

The leader is built in this process (``tests.support.inprocess``); its worker is a real ``opod join``
with the simulator engine.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from opod.http.inbound import MAX_NESTING
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OPOD, OpodProcess, opod_cli, sim_worker

CHAT, CATALOG_CHAT, CRASHY = "sim-chat", "smollm2-135m-instruct", "sim-crashy"
PLAIN_EMBED, MATRYOSHKA = "all-minilm-l6-v2", "nomic-embed-text-v1.5-gguf"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessLeader, OpodProcess]]:
    root = tmp_path_factory.mktemp("client-input")
    leader = InProcessLeader(root / "leader")
    worker = sim_worker(leader, root / "worker", "n1")
    try:
        worker.wait_for_line("registered with", timeout=30)
        for model in (CHAT, CATALOG_CHAT, PLAIN_EMBED, MATRYOSHKA):
            added = opod_cli(leader, "model", "add", model, "--engine", "sim")
            assert added.returncode == 0, added.stderr
        status, body = leader.admin(
            "POST",
            "/api/v1/models",
            {"name": "sim-defined", "aliases": ["friendly"], "profiles": [{"engine": "sim"}], "scaling": {"min": 1}},
        )
        assert status == 200, body
        leader.wait_served(CHAT, CATALOG_CHAT, PLAIN_EMBED, MATRYOSHKA, "sim-defined", timeout=90)
        yield leader, worker
    finally:
        worker.stop()
        leader.stop()


def send(url: str, body: bytes | str, key: str | None, method: str = "POST") -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.request(method, url, content=body, headers=headers, timeout=30)


def client(leader: InProcessLeader) -> openai.OpenAI:
    return openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- no input gets a 500 --------------------------------------------------------------------------


def test_json_nested_past_the_limit_is_a_400_naming_the_limit_on_every_api(fleet) -> None:
    leader, _ = fleet
    deep = nested(3000)
    calls = [
        (leader.url + "/v1/chat/completions", f'{{"model": "{CHAT}", "messages": {deep}}}'),
        (leader.url + "/v1/responses", f'{{"model": "{CHAT}", "input": {deep}}}'),
        (leader.url + "/v1/batches", f'{{"endpoint": {deep}}}'),
        (leader.url + f"/admin/v1/models/{CHAT}/load", f'{{"node": {deep}}}'),
        (leader.admin_url + "/api/v1/keys", f'{{"name": {deep}}}'),
    ]
    for url, body in calls:
        answer = send(url, body, leader.key)
        assert answer.status_code == 400, (url, answer.status_code, answer.text[:300])
        assert f"nested at most {MAX_NESTING} levels" in answer.text, (url, answer.text[:300])
    scim = send(leader.url + "/scim/v2/Users", f'{{"userName": {deep}}}', "scim-token")
    assert scim.status_code == 400 and scim.json()["scimType"] == "invalidSyntax", scim.text[:300]
    # At the limit itself, the body is read as usual: here, a refusal of what it holds.
    at_limit = send(
        leader.url + "/v1/chat/completions", f'{{"model": "{CHAT}", "messages": {nested(MAX_NESTING - 1)}}}', leader.key
    )
    assert at_limit.status_code == 400 and at_limit.json()["error"]["param"] == "messages[0]", at_limit.text


LONE = '"a\\ud800b"'
"""A lone UTF-16 surrogate, as JSON escapes it: valid JSON, but no text any encoder can write."""


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", f'{{"model": "{CHAT}", "messages": [{{"role": "user", "content": {LONE}}}]}}', None),
        ("/v1/completions", f'{{"model": "{CHAT}", "prompt": {LONE}}}', "prompt"),
        ("/v1/responses", f'{{"model": "{CHAT}", "input": {LONE}}}', "input"),
        ("/v1/embeddings", f'{{"model": "{PLAIN_EMBED}", "input": [{LONE}]}}', "input[0]"),
        ("/v1/batches", f'{{"input_file_id": {LONE}, "endpoint": "/v1/chat/completions"}}', "input_file_id"),
    ],
)
def test_text_that_cannot_be_encoded_is_a_400_naming_the_field(fleet, path: str, body: str, param: str | None) -> None:
    leader, _ = fleet
    answer = send(leader.url + path, body, leader.key)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == (param or "messages[0].content"), error
    assert "cannot be encoded" in error["message"], error


def test_text_that_cannot_be_encoded_is_a_400_naming_the_field_on_the_management_apis_too(fleet) -> None:
    leader, _ = fleet
    for url, body, said in (
        (leader.admin_url + "/api/v1/keys", f'{{"name": {LONE}}}', lambda answer: answer["error"]),
        (
            leader.url + "/admin/v1/adapters",
            f'{{"base": "{CHAT}", "name": {LONE}, "source": "x"}}',
            lambda answer: answer["error"]["message"],
        ),
    ):
        answer = send(url, body, leader.key)
        assert answer.status_code == 400, (url, answer.text)
        assert said(answer.json()).startswith("name holds text that cannot be encoded"), answer.text


def test_a_lone_surrogate_in_a_batch_line_fails_that_line_not_the_leader(fleet) -> None:
    leader, _ = fleet
    line = f'{{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {{"model": "{CHAT}", '
    line += f'"messages": [{{"role": "user", "content": {LONE}}}]}}}}\n'
    uploaded = client(leader).files.create(file=("in.jsonl", line.encode()), purpose="batch")
    batch = client(leader).batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data, batch
    (error,) = batch.errors.data
    assert error.line == 1 and error.param == "body.messages[0].content", error
    assert error.message is not None and "cannot be encoded" in error.message, error


def test_a_lifetime_past_a_hundred_years_is_a_400_through_the_api_and_both_commands(fleet) -> None:
    leader, _ = fleet
    for path, body in (
        ("/api/v1/keys", {"name": "forever", "expires_in": "999999999h"}),
        ("/api/v1/node-tokens", {"name": "forever", "expires_in": "99999999999999999999d"}),
    ):
        status, answer = leader.admin("POST", path, body)
        assert status == 400 and "expires_in" in answer["error"] and "a hundred years" in answer["error"], answer
    for path in ("/api/v1/usage?since=999999999h", "/api/v1/audit?since=999999999h"):
        status, answer = leader.admin("GET", path)
        assert status == 400 and "since" in answer["error"] and "a hundred years" in answer["error"], answer
    status, made = leader.admin("POST", "/api/v1/keys", {"name": "long", "expires_in": "36500d"})
    assert status == 201 and made["expires_at"], made
    for args in (
        ["token", "create", "--ttl", "999999999h"],
        ["ctl", "keys", "create", "forever", "--expires-in", "999999999h"],
    ):
        result = subprocess.run(
            [*OPOD, *args], env=leader.cli_env(), capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode != 0 and "a hundred years" in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and "HTTP 500" not in result.stderr, result.stderr


# --- OpenAI's rules, not silence -------------------------------------------------------------------


def test_dimensions_cut_a_matryoshka_models_vectors_and_are_refused_for_any_other(fleet) -> None:
    leader, _ = fleet
    openai_client = client(leader)
    whole = openai_client.embeddings.create(model=MATRYOSHKA, input=["one text", "another"])
    cut = openai_client.embeddings.create(model=MATRYOSHKA, input=["one text", "another"], dimensions=8)
    for full, short in zip(whole.data, cut.data, strict=True):
        assert len(short.embedding) == 8
        expected = np.asarray(full.embedding[:8]) / np.linalg.norm(full.embedding[:8])
        assert np.allclose(short.embedding, expected, atol=1e-6), "the first 8 values, back to unit length"
    # As floats too (the openai client asks for base64 unless told otherwise).
    raw = send(
        leader.url + "/v1/embeddings",
        json.dumps({"model": MATRYOSHKA, "input": "one text", "dimensions": 8, "encoding_format": "float"}),
        leader.key,
    ).json()
    assert np.allclose(raw["data"][0]["embedding"], cut.data[0].embedding, atol=1e-6)
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model=PLAIN_EMBED, input="text", dimensions=8)
    assert refused.value.body["param"] == "dimensions" and "Matryoshka" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model=MATRYOSHKA, input="text", dimensions=769)
    assert refused.value.body["param"] == "dimensions" and "768" in refused.value.body["message"]
    same = openai_client.embeddings.create(model=PLAIN_EMBED, input="text", dimensions=384)
    assert len(same.data[0].embedding) == 384, "its own size is no change: answered"


@pytest.mark.parametrize(
    ("bias", "param"),
    [
        ({"abc": 5}, "logit_bias.abc"),
        ({"15": 500}, "logit_bias.15"),
        ({"15": -100.5}, "logit_bias.15"),
        ({"-1": 1}, "logit_bias.-1"),
    ],
)
def test_logit_bias_takes_token_ids_and_biases_from_minus_100_to_100(fleet, bias: dict, param: str) -> None:
    leader, _ = fleet
    with pytest.raises(openai.BadRequestError) as refused:
        client(leader).chat.completions.create(model=CHAT, messages=HELLO, max_tokens=2, logit_bias=bias)
    assert refused.value.body["param"] == param, refused.value.body
    answered = client(leader).chat.completions.create(
        model=CHAT, messages=HELLO, max_tokens=2, logit_bias={"15": -100, "16": 100}
    )
    assert answered.choices


def test_the_responses_api_names_its_own_fields_in_its_refusals(fleet) -> None:
    leader, _ = fleet
    with pytest.raises(openai.BadRequestError) as refused:
        client(leader).responses.create(model=CATALOG_CHAT, input="Hi", max_output_tokens=100_000)
    body = refused.value.body
    assert body["param"] == "max_output_tokens" and "max_output_tokens=100000" in body["message"], body
    assert "max_tokens" not in body["message"].replace("max_output_tokens", ""), body
    with pytest.raises(openai.BadRequestError) as refused:
        client(leader).responses.create(model=CATALOG_CHAT, input="Hi", extra_body={"max_tokens": 5})
    assert refused.value.body["param"] == "max_tokens" and "max_output_tokens" in refused.value.body["message"]


def test_a_models_alias_names_it_on_v1(fleet) -> None:
    leader, _ = fleet
    openai_client = client(leader)
    answer = openai_client.chat.completions.create(model="friendly", messages=HELLO, max_tokens=2)
    assert answer.choices and answer.model == "sim-defined", answer.model
    assert openai_client.models.retrieve("friendly").id == "friendly"
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.create(model="unfriendly", messages=HELLO, max_tokens=2)


# --- what a stranger learns ------------------------------------------------------------------------


def test_a_caller_without_the_admin_key_is_not_told_where_the_leader_keeps_it(fleet) -> None:
    leader, _ = fleet
    home = str(leader.home.resolve())
    for url in (leader.url + "/admin/v1/nodes", leader.admin_url + "/api/v1/nodes"):
        for key in (None, "sk-wrong"):
            answer = send(url, b"", key, method="GET")
            assert answer.status_code == 401, answer.text
            assert home not in answer.text and "/admin.key" not in answer.text.replace("~/.opod/admin.key", ""), (
                answer.text
            )
            assert "admin.key" in answer.text, "it still says which file, in words"


def test_a_long_model_name_is_not_echoed_whole(fleet) -> None:
    leader, _ = fleet
    name = "m" * 10_000
    answer = send(leader.url + "/v1/chat/completions", json.dumps({"model": name, "messages": HELLO}), leader.key)
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found", answer.text[:200]
    assert len(answer.text) < 1000 and "mmmm" in answer.text, answer.text[:300]
    retrieved = send(leader.url + "/v1/models/" + name, b"", leader.key, method="GET")
    assert retrieved.status_code == 404 and len(retrieved.text) < 1000, retrieved.text[:300]


def test_while_an_engine_crashes_its_503_says_so_in_opods_words_and_the_log_has_its_own(
    fleet, caplog: pytest.LogCaptureFixture
) -> None:
    leader, _ = fleet
    caplog.set_level(logging.INFO, logger="opod.gateway")
    # Every request crashes this model's engine: it keeps restarting, and its log says why.
    status, body = leader.admin(
        "POST",
        "/api/v1/models",
        {
            "name": CRASHY,
            "profiles": [{"engine": "sim", "args": ["--crash-after", "0"]}],
            "scaling": {"min": 1},
        },
    )
    assert status == 200, body
    leader.wait_served(CRASHY, timeout=60)
    refusals: list[str] = []
    deadline = time.monotonic() + 40
    said_crashed = re.compile(r"engine (crashed|keeps crashing)")
    while time.monotonic() < deadline and not any(said_crashed.search(r) for r in refusals):
        answer = send(leader.url + "/v1/chat/completions", json.dumps({"model": CRASHY, "messages": HELLO}), leader.key)
        if answer.status_code == 503:
            refusals.append(answer.json()["error"]["message"])
        time.sleep(0.2)
    assert any(said_crashed.search(r) for r in refusals), refusals
    for message in refusals:
        assert "crashing on purpose" not in message, message  # the engine's own log line
        assert not re.search(r"\d+\.\d+\.\d+\.\d+:\d+|Connect call failed|/", message), message
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "opod.gateway")
    assert "crashing on purpose" in logged, "the leader's log keeps what the client is not told"
    leader.admin("DELETE", f"/api/v1/models/{CRASHY}")
