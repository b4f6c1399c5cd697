"""Same seed and same requests: same answers. Another seed: other answers."""

from __future__ import annotations

import json

import httpx

PROMPTS = ["Tell me a story.", "What is a KV cache?", "Count to ten."]


def answers(url: str, order: list[int]) -> dict[int, str]:
    out = {}
    for i in order:
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": 40 + i},
        )
        body = r.json()
        out[i] = (
            f"{body['choices'][0]['finish_reason']}|{body['usage']['completion_tokens']}|{body['choices'][0]['message']['content']}"
        )
    return out


def test_the_same_seed_gives_the_same_answers_and_another_seed_other_ones(sim) -> None:
    a, b, c = sim(seed=11), sim(seed=11), sim(seed=12)
    first = answers(a.url, [0, 1, 2])
    assert answers(b.url, [2, 0, 1]) == first  # an answer does not depend on what was served before it
    assert answers(a.url, [1, 2, 0]) == first
    other = answers(c.url, [0, 1, 2])
    assert all(first[i] != other[i] for i in first)
    text = [
        httpx.post(h.url + "/v1/completions", json={"model": "sim-model", "prompt": "Once", "max_tokens": 30}).json()[
            "choices"
        ][0]["text"]
        for h in (a, b, c)
    ]
    assert text[0] == text[1] != text[2]


def test_streamed_and_whole_answers_agree_and_the_request_seed_counts(sim) -> None:
    h = sim(seed=5)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12}
    whole = httpx.post(h.url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    raw = httpx.post(h.url + "/v1/chat/completions", json={**body, "stream": True}).text
    streamed = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in raw.split("\n\n")
        if line.startswith("data: {")
    )
    assert streamed == whole
    reseeded = httpx.post(h.url + "/v1/chat/completions", json={**body, "seed": 99}).json()["choices"][0]["message"][
        "content"
    ]
    assert reseeded != whole


def test_echo_mode_repeats_the_user_message(sim) -> None:
    h = sim(mode="echo")
    r = httpx.post(
        h.url + "/v1/chat/completions",
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": "ping pong"}],
            "max_tokens": 4,
            "ignore_eos": True,
        },
    )
    assert r.json()["choices"][0]["message"]["content"] == "ping pong ping pong"


def test_the_short_and_the_usual_way_through_the_server_answer_alike(sim) -> None:
    # The generation routes take the server's short way; a request with Expect: 100-continue takes the
    # usual ASGI way to the same handler.
    h = sim(seed=9)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "both ways"}], "max_tokens": 10}
    short = httpx.post(h.url + "/v1/chat/completions", json=body)
    usual = httpx.post(h.url + "/v1/chat/completions", json=body, headers={"Expect": "100-continue"})
    assert short.status_code == usual.status_code == 200
    assert short.headers["content-type"] == usual.headers["content-type"]
    for key in ("choices", "usage", "model"):
        assert short.json()[key] == usual.json()[key]
    streamed = [
        httpx.post(h.url + "/v1/chat/completions", json={**body, "stream": True}, headers=extra).text
        for extra in ({}, {"Expect": "100-continue"})
    ]
    contents = [
        [
            json.loads(line[6:])["choices"][0]["delta"].get("content")
            for line in text.split("\n\n")
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        ]
        for text in streamed
    ]
    assert (
        contents[0] == contents[1]
        and streamed[0].endswith("data: [DONE]\n\n")
        and streamed[1].endswith("data: [DONE]\n\n")
    )
