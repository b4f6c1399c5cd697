"""KV-cache events on ZMQ: the frames, batches and event maps of vLLM 0.32, and the replay socket."""

from __future__ import annotations

import json
import struct
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from opod.contract.blockhash import block_hashes
from opod.sim.prefix_cache import engine_hash
from tests.sim.conftest import ENGINE_WIRE

RECORDED = ENGINE_WIRE / "vllm-kv-events"


def decode(frames: list[bytes]) -> dict[str, Any]:
    """One decoder for recorded and simulated messages: plain msgpack, no simulator code."""
    topic, seq, payload = frames
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    return {
        "topic": topic.decode(),
        "seq": struct.unpack(">Q", seq)[0],
        "seq_len": len(seq),
        "batch": batch,
        "payload": payload,
    }


def shape(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What must match: batch layout, msgpack float for ts, and per event type its key order and value types."""
    keys: dict[str, list[str]] = {}
    types: dict[tuple[str, str], set[str]] = {}
    for m in messages:
        ts, events, rank = m["batch"]
        assert (len(m["batch"]), m["payload"][:2], m["seq_len"], type(ts), rank) == (3, b"\x93\xcb", 8, float, 0)
        for e in events:
            assert next(iter(e)) == "type"
            assert keys.setdefault(e["type"], list(e)) == list(e)
            for k, v in e.items():
                kind = type(v).__name__
                if isinstance(v, list) and v:
                    kind += "[" + "|".join(sorted({type(x).__name__ for x in v})) + "]"
                types.setdefault((e["type"], k), set()).add(kind)
    return {"keys": keys, "types": types}


def recorded_messages() -> list[dict[str, Any]]:
    if not (RECORDED / "index.json").is_file():
        pytest.skip(f"the recorded vLLM events are not beside this clone ({RECORDED})")
    out = []
    for item in json.loads((RECORDED / "index.json").read_text()):
        if "bytes-hash" in item["file"]:
            continue  # the 32-byte-hash run; the simulator publishes vLLM's default uint64 hashes
        f = item["frames"]
        payload = (ENGINE_WIRE / item["file"]).read_bytes()
        out.append(decode([bytes.fromhex(f["frame0_topic_hex"]), bytes.fromhex(f["frame1_seq_hex"]), payload]))
    return out


@pytest.fixture
def sub():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, port
    sock.close(0)
    ctx.term()


def receive(sock: zmq.Socket, timeout_ms: int = 2000) -> list[dict[str, Any]]:
    out = []
    while sock.poll(timeout_ms):
        out.append(decode(sock.recv_multipart()))
        timeout_ms = 150
    return out


def complete(url: str, prompt: list[int], max_tokens: int = 1) -> dict[str, Any]:
    r = httpx.post(url + "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()


def test_events_have_the_recorded_vllm_structure_and_real_token_ids(sim, sub) -> None:
    sock, port = sub
    h = sim(
        kv_events=f"tcp://127.0.0.1:{port}",
        kv_events_topic="kv-events",
        kv_events_replay="tcp://127.0.0.1:*",
        block_size=32,
        kv_blocks=16,
        output_min=1,
        output_max=1,
    )
    messages: list[dict[str, Any]] = []
    for attempt in range(20):  # the subscription reaches the publisher a moment after it connects
        complete(h.url, list(range(10_000 * attempt, 10_000 * attempt + 70)))
        messages = receive(sock, 500)
        if messages:
            break
    assert messages, "no KV event arrived"
    assert httpx.post(h.url + "/sleep?level=1").status_code == 200
    httpx.post(h.url + "/wake_up")
    prompt = list(range(1, 200))  # six full blocks of 32
    complete(h.url, prompt)  # the clear goes out with this step, before its stores
    complete(h.url, prompt)  # a pure hit: no event
    complete(h.url, list(range(500, 900)))  # 13 blocks in a pool of 16: evictions make room
    messages += receive(sock)

    seqs = [m["seq"] for m in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert {m["topic"] for m in messages} == {"kv-events"}
    kinds = [[e["type"] for e in m["batch"][1]] for m in messages]
    assert ["AllBlocksCleared"] in kinds or any(k[0] == "AllBlocksCleared" for k in kinds)
    assert any("BlockRemoved" in k for k in kinds)
    for k in kinds:  # removals come before stores within a batch
        assert k == sorted(k, key=lambda t: {"AllBlocksCleared": 0, "BlockRemoved": 1, "BlockStored": 2}[t])

    stored = [e for m in messages for e in m["batch"][1] if e["type"] == "BlockStored"]
    six = next(e for e in stored if e["token_ids"][:3] == [1, 2, 3])
    assert len(six["block_hashes"]) == 6 and six["parent_block_hash"] is None and six["block_size"] == 32
    assert six["token_ids"] == prompt[:192]
    contract = block_hashes(six["token_ids"], 32)  # what a worker recomputes from the event
    assert six["block_hashes"] == [engine_hash(k) for k in contract]
    assert all(len(e["token_ids"]) == 32 * len(e["block_hashes"]) for e in stored)
    assert all(len(e["block_hashes"]) == 1 for m in messages for e in m["batch"][1] if e["type"] == "BlockRemoved")

    ours, theirs = shape(messages), shape(recorded_messages())
    assert ours["keys"] == theirs["keys"]
    for key, kinds_seen in ours["types"].items():
        assert kinds_seen <= theirs["types"][key], (key, kinds_seen, theirs["types"][key])

    replay_at = httpx.get(h.url + "/sim/state").json()["kv_events_replay"]
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay_at)
    start = messages[1]["seq"]
    dealer.send_multipart([b"", struct.pack(">Q", start)])
    replayed = []
    while dealer.poll(3000):
        empty, topic, seq, payload = dealer.recv_multipart()
        if seq == b"\xff" * 8:
            assert (topic, payload) == (b"", b"")
            break
        replayed.append((struct.unpack(">Q", seq)[0], payload))
    dealer.close(0)
    assert replayed == [(m["seq"], m["payload"]) for m in messages[1:]]


def test_kv_event_sources_reports_the_configuration(sim, sub) -> None:
    _, port = sub
    h = sim(kv_events=f"tcp://127.0.0.1:{port}", kv_events_topic="t")
    src = httpx.get(h.url + "/kv_event_sources").json()["0"]
    assert (src["publisher"], src["endpoint"], src["topic"], src["replay_endpoint"]) == (
        "zmq",
        f"tcp://127.0.0.1:{port}",
        "t",
        None,
    )
    assert httpx.get(sim().url + "/kv_event_sources").json() == {}
