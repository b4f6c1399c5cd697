"""vLLM's ``POST /v1/chat/completions/render``: its reply's shape, and token ids that match the KV events block for block."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import zmq

from tests.sim.conftest import ENGINE_WIRE
from tests.sim.test_kv_events import receive

NOTES = ENGINE_WIRE / "vllm-other-endpoints.md"
CHAT = {
    "model": "sim-model",
    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
}


def captured_render() -> dict[str, Any]:
    """The render reply recorded from vLLM 0.32 in the engine-wire notes (the JSON block under its heading)."""
    if not NOTES.is_file():
        pytest.skip(f"the engine-wire notes are not beside this clone ({NOTES})")
    text = NOTES.read_text()
    match = re.search(r"^## POST /v1/chat/completions/render.*?```json\n(.*?)\n```", text, re.DOTALL | re.MULTILINE)
    if not match:
        pytest.skip(f"{NOTES.name} has no recorded render reply")
    return json.loads(match.group(1))


def kinds(value: Any) -> Any:
    """A body's shape: the same keys in the same order, with each value replaced by its JSON type."""
    if isinstance(value, dict):
        return [(k, kinds(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", sorted({json.dumps(kinds(v)) for v in value})]
    return type(value).__name__


def test_render_has_vllms_shape_and_the_chat_template_ids(sim) -> None:
    h = sim()
    r = httpx.post(h.url + "/v1/chat/completions/render", json={**CHAT, "max_tokens": 4})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    ours = r.json()
    theirs = captured_render()
    assert kinds(ours) == kinds(theirs)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", ours["request_id"])
    assert ours["token_ids"] == httpx.post(h.url + "/tokenize", json=CHAT).json()["tokens"]
    assert (ours["model"], ours["output_mode"], ours["stream"], ours["priority"]) == ("sim-model", "tokens", False, 0)
    assert ours["sampling_params"]["max_tokens"] == 4 and ours["sampling_params"]["output_kind"] == 2


def test_render_refuses_what_a_chat_request_refuses(sim) -> None:
    h = sim()
    unknown = httpx.post(h.url + "/v1/chat/completions/render", json={**CHAT, "model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    empty = httpx.post(h.url + "/v1/chat/completions/render", json={"model": "sim-model", "messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "messages"
    assert httpx.post(h.url + "/v1/chat/completions/render", content=b"{").status_code == 400
    assert httpx.get(h.url + "/v1/chat/completions/render").status_code == 405


def test_rendered_ids_are_the_ids_the_kv_events_publish(sim) -> None:
    """vllm-router hashes the rendered ids block by block and looks them up among the blocks the events stored."""
    h = sim(kv_events_bind="tcp://127.0.0.1:*", block_size=16, output_min=1, output_max=1)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(httpx.get(h.url + "/sim/state").json()["kv_events_bind"])
    try:
        for attempt in range(40):  # until the subscription has reached the publisher
            httpx.post(
                h.url + "/v1/completions",
                json={
                    "model": "sim-model",
                    "prompt": list(range(500 * attempt + 1, 500 * attempt + 40)),
                    "max_tokens": 1,
                },
            )
            if receive(sub, 100):
                break
        system = " ".join(f"rule{i}." for i in range(120))
        body = {
            "model": "sim-model",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "go"}],
            "max_tokens": 1,
        }
        rendered = httpx.post(h.url + "/v1/chat/completions/render", json=body).json()["token_ids"]
        assert httpx.post(h.url + "/v1/chat/completions", json=body).status_code == 200
        stored = [e for m in receive(sub) for e in m["batch"][1] if e["type"] == "BlockStored"]
    finally:
        sub.close(0)
        ctx.term()
    published = [t for e in stored for t in e["token_ids"]]
    full = len(rendered) // 16 * 16
    assert full >= 16 * 10
    assert published[:full] == rendered[:full]
