"""vLLM's KV-event wire: bind-or-connect, bad messages, and the recorded vLLM 0.32 frames beside this clone."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from opod.contract.blockhash import block_hashes
from opod.sim.kv_events import binds as sim_binds
from opod.worker.kvevents import BlockRemoved, BlockStored, EngineBlocks, KVReport
from opod.worker.kvlistener import (
    KVDecodeError,
    decode_payload,
    dial_address,
    engine_binds,
    split_message,
)
from tests.worker.kv_support import (
    RECORDED,
    LeaderView,
    fake_engine_pub,
    publish_until_heard,
    settle,
)

# --- vLLM's wire ------------------------------------------------------------------------------------------


def test_bind_or_connect_follows_vllms_rule_as_the_simulator_does() -> None:
    for endpoint in (
        "tcp://*:5557",
        "tcp://[::]:5557",
        "tcp://127.0.0.1:5557",
        "tcp://10.0.0.2:5557",
        "ipc:///tmp/kv",
        "inproc://kv",
        "tcp://localhost:5557",
    ):
        assert engine_binds(endpoint) == sim_binds(endpoint), endpoint
    assert dial_address("tcp://*:5557") == "tcp://127.0.0.1:5557"
    assert dial_address("tcp://[::]:5558") == "tcp://127.0.0.1:5558"
    assert dial_address("ipc:///tmp/kv") == "ipc:///tmp/kv"


def test_bad_messages_raise_clear_errors() -> None:
    with pytest.raises(KVDecodeError, match="3 frames"):
        split_message([b"t", b"\x00" * 8])
    with pytest.raises(KVDecodeError, match="sends 8"):
        split_message([b"t", b"\x00", b""])
    with pytest.raises(KVDecodeError, match="not msgpack"):
        decode_payload(b"\xc1")
    with pytest.raises(KVDecodeError, match="not a batch"):
        decode_payload(msgpack.packb({"ts": 1}))
    with pytest.raises(KVDecodeError, match="token_ids"):
        decode_payload(
            msgpack.packb(
                [
                    1.0,
                    [
                        {
                            "type": "BlockStored",
                            "block_hashes": [1],
                            "parent_block_hash": None,
                            "token_ids": "abc",
                            "block_size": 16,
                        }
                    ],
                    0,
                ]
            )
        )
    # Older vLLM's tagged arrays, and an event type this worker does not know, are read (the latter skipped).
    events = decode_payload(
        msgpack.packb(
            [
                1.0,
                [
                    ["BlockStored", [5], None, list(range(16)), 16, None, "GPU"],
                    ["BlockRemoved", [5], "GPU"],
                    {"type": "SomethingNew"},
                ],
                0,
            ]
        )
    )
    assert [type(e).__name__ for e in events] == ["BlockStored", "BlockRemoved"]


def _recorded() -> list[dict[str, Any]]:
    index = RECORDED / "vllm-kv-events-decoded.json"
    if not index.is_file():
        pytest.skip(f"the recorded vLLM events are not beside this clone ({index})")
    return json.loads(index.read_text())


def _wire_hash(value: Any) -> int | bytes:
    return bytes.fromhex(value["$bytes_hex"]) if isinstance(value, dict) else value


def test_recorded_frames_decode_as_the_capture_says() -> None:
    for item in _recorded():
        payload = (RECORDED / item["file"]).read_bytes()
        events = decode_payload(payload)
        want = item["decoded"][1]
        assert [type(e).__name__ for e in events] == [e["type"] for e in want], item["file"]
        for got, raw in zip(events, want):
            if isinstance(got, (BlockStored, BlockRemoved)):
                assert list(got.block_hashes) == [_wire_hash(h) for h in raw["block_hashes"]]
            if isinstance(got, BlockStored):
                parent = raw["parent_block_hash"]
                assert got.parent == (None if parent is None else _wire_hash(parent))
                assert list(got.token_ids) == raw["token_ids"] and got.block_size == raw["block_size"] == 32
                assert got.plain == tuple(k is None for k in raw["extra_keys"])


def _expected_from_capture(items: list[dict[str, Any]]) -> list[tuple[list[str], list[str], bool]]:
    """Per batch, (stored, removed, cleared) worked out another way: every block's whole token prefix, hashed at once."""
    prefix: dict[Any, list[int]] = {}  # engine hash → all tokens up to and including its block
    contract: dict[Any, str] = {}  # engine hash → contract hash (plain blocks only)
    held: set[str] = set()
    out = []
    for item in items:
        stored: list[str] = []
        removed: list[str] = []
        cleared = False
        for e in item["decoded"][1]:
            if e["type"] == "AllBlocksCleared":
                cleared, stored, removed = True, [], []
                prefix.clear(), contract.clear(), held.clear()
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    key = contract.pop(_wire_hash(h), None)
                    if key in held:
                        held.discard(key)
                        removed.append(key)
            else:
                size = e["block_size"]
                parent = e["parent_block_hash"]
                before = [] if parent is None else prefix[_wire_hash(parent)]
                tainted = parent is not None and _wire_hash(parent) not in contract
                for i, h in enumerate(e["block_hashes"]):
                    tokens = before + e["token_ids"][: (i + 1) * size]
                    prefix[_wire_hash(h)] = tokens
                    tainted = tainted or e["extra_keys"][i] is not None
                    if not tainted:
                        key = block_hashes(tokens, size)[-1]
                        contract[_wire_hash(h)] = key
                        if key not in held:
                            held.add(key)
                            stored.append(key)
        out.append((stored, removed, cleared))
    return out


def test_recorded_batches_become_the_contract_hashes_of_their_tokens() -> None:
    items = [i for i in _recorded() if "bytes-hash" not in i["file"]]
    expected = _expected_from_capture(items)
    report = KVReport()
    blocks = EngineBlocks(report, "vllm")
    for item, (stored, removed, cleared) in zip(items, expected):
        blocks.apply(decode_payload((RECORDED / item["file"]).read_bytes()))
        kv = report.drain()
        assert kv is not None and kv.block_size == 32, item["file"]
        assert (kv.stored or [], kv.removed or [], kv.cleared) == (stored, removed, cleared), item["file"]
    assert sum(len(s) for s, _, _ in expected) > 400 and sum(len(r) for _, r, _ in expected) == 40
    assert [c for _, _, c in expected].count(True) == 2
    assert blocks.counters.not_plain == 8  # the cache-salted prompt (seq 4)

    # The 32-byte-hash run: the same contract hashes from the same tokens.
    (item,) = [i for i in _recorded() if "bytes-hash" in i["file"]]
    report = KVReport()
    blocks = EngineBlocks(report)
    blocks.apply(decode_payload((RECORDED / item["file"]).read_bytes()))
    kv = report.drain()
    assert kv is not None and kv.stored == block_hashes(item["decoded"][1][0]["token_ids"], 32)


async def test_recorded_frames_through_a_listener_say_cleared_at_each_gap(listeners) -> None:
    """The capture replayed by a fake engine, with its own counter: seq 0–19, then 38 and 45 (two gaps)."""
    items = [i for i in _recorded() if "bytes-hash" not in i["file"]]
    report = KVReport()
    listener = listeners(report)
    view = LeaderView()
    async with fake_engine_pub(listener) as pub:
        # The first batch is sent until it is heard (the subscription takes a moment to reach the publisher).
        await publish_until_heard(pub, listener, (RECORDED / items[0]["file"]).read_bytes(), topic=b"kv-events")
        for item in items[1:]:
            f = item["frames"]
            await pub.send_multipart(
                [
                    bytes.fromhex(f["frame0_topic_hex"]),
                    bytes.fromhex(f["frame1_seq_hex"]),
                    (RECORDED / item["file"]).read_bytes(),
                ]
            )
        await settle(report)
        view.apply(report.drain())
    # Resets: AllBlocksCleared at 12, the gap before 38 (whose 40 removals name blocks forgotten there),
    # the gap before 45, and 45's two AllBlocksCleared.
    assert listener.lost == 2 and listener.blocks is not None
    assert listener.blocks.counters.resets == 5
    assert listener.blocks.counters.unknown_removed == 40
    assert view.cleared == 1 and view.seq == 1
    assert not view.blocks and not report.held
