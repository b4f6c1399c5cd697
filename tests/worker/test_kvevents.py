"""A worker's KV-cache events → the contract's block hashes in heartbeats.

Against the real simulator (``python -m opod sim --kv-events …`` as a child
process), the recorded vLLM 0.32 frames beside this clone, and the worker's own
engine manager running the simulator under its supervisor.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from opod.catalog import load_catalog
from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.sim.kv_events import binds as sim_binds
from opod.worker.agent import Agent
from opod.worker.engines import EngineManager
from opod.worker.kvevents import BlockRemoved, BlockStored, EngineBlocks, KVReport
from opod.worker.kvlistener import (
    KVDecodeError,
    KVEventListener,
    decode_payload,
    dial_address,
    engine_binds,
    split_message,
)
from opod.worker.supervisor import Supervisor
from tests.support.engine_manager import load_and_serve

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO.parent / "shared" / "notes" / "engine-wire"
BS = 16  # the simulator's default block size


# --- helpers ------------------------------------------------------------------------------------


@dataclass
class LeaderView:
    """What a leader applying the batches in order would hold for this worker."""

    blocks: set[str] = field(default_factory=set)
    seq: int = 0
    cleared: int = 0

    def apply(self, kv: nodeapi.KVBlocks | None) -> nodeapi.KVBlocks | None:
        if kv is None:
            return None
        assert kv.seq == self.seq + 1, f"batch {kv.seq} after {self.seq}"
        self.seq = kv.seq
        removed, stored = set(kv.removed or ()), set(kv.stored or ())
        assert not removed & stored, "a hash both stored and removed in one batch"
        if kv.cleared:
            self.cleared += 1
            self.blocks.clear()
        self.blocks = (self.blocks - removed) | stored
        return kv


@dataclass
class Sim:
    proc: asyncio.subprocess.Process
    url: str
    client: httpx.AsyncClient

    async def chat(self, system: str, user: str) -> list[int]:
        return await chat(self.client, self.url, system, user)

    async def state(self) -> dict[str, Any]:
        return (await self.client.get(self.url + "/sim/state")).json()

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await asyncio.wait_for(self.proc.wait(), 10)


async def chat(client: httpx.AsyncClient, url: str, system: str, user: str) -> list[int]:
    """One chat (one answer token); returns the prompt's token ids from the simulator's own ``/tokenize``.

    The user message is padded so that prompt + answer fill no extra block: the blocks are the prompt's.
    """
    while True:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        r = await client.post(url + "/tokenize", json={"model": "sim-model", "messages": messages})
        assert r.status_code == 200, r.text
        tokens = r.json()["tokens"]
        if len(tokens) % BS != BS - 1:
            break
        user += " please"
    r = await client.post(url + "/v1/chat/completions", json={"model": "sim-model", "messages": messages, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokens)
    return tokens


async def start_sim(*args: str) -> Sim:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "opod", "sim", "--port", "0", "--time-scale", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    if "listening on " not in line:
        proc.kill()
        raise AssertionError(f"opod sim did not start: {line!r} {(await proc.stdout.read()).decode()[-2000:]}")
    sim = Sim(proc, line.split("listening on ")[1].split()[0], httpx.AsyncClient(timeout=10))
    deadline = time.monotonic() + 15
    while True:
        try:
            await sim.state()
            break
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.returncode is not None:
                await sim.kill()
                raise AssertionError("opod sim did not start listening") from None
            await asyncio.sleep(0.02)
    # The engine's PUB socket dials ours; give the subscription a moment to reach it (vLLM drops until then).
    await asyncio.sleep(0.5)
    return sim


@pytest.fixture
async def sims() -> Any:
    started: list[Sim] = []

    async def start(*args: str) -> Sim:
        sim = await start_sim(*args)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        await sim.kill()
        await sim.client.aclose()


@pytest.fixture
async def listeners() -> Any:
    """``listen(report, **kw)`` starts a listener; all are closed at the end, and must release their blocks."""
    opened: list[KVEventListener] = []

    def listen(report: KVReport, **kw: Any) -> KVEventListener:
        listener = KVEventListener(report, name="sim-model", **kw)
        listener.start()
        opened.append(listener)
        return listener

    yield listen
    for listener in opened:
        await listener.close()
    for listener in opened:
        assert listener.report.sources == 0 and not listener.report.held
        listener.report.close()


async def settle(report: KVReport, quiet: float = 0.3, timeout: float = 10.0) -> None:
    """Wait until no change has arrived for ``quiet`` seconds (events come a few ms after an answer)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = (report.pending, report.seq, len(report.held))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        await asyncio.sleep(0.02)


def leading_shared(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


FILLER = "You are a careful assistant who answers in full sentences and checks each fact twice. " * 6


# --- the listener against the real simulator ----------------------------------------------------------


async def test_chat_blocks_are_the_contract_hashes_of_the_simulators_own_tokens(sims, listeners) -> None:
    report = KVReport()
    listener = listeners(report)
    assert listener.engine_endpoint.startswith("tcp://127.0.0.1:") and not engine_binds(listener.engine_endpoint)
    sim = await sims("--kv-events", listener.engine_endpoint)
    view = LeaderView()

    t1 = await sim.chat(FILLER, "What is the capital of France?")
    await settle(report)
    kv = view.apply(report.drain())
    assert kv is not None and (kv.seq, kv.block_size, kv.cleared, kv.removed) == (1, BS, False, None)
    assert kv.stored == block_hashes(t1, BS) and len(kv.stored) >= 5

    # Same system prompt: the shared blocks are cache hits (no event); the new ones chain from them.
    t2 = await sim.chat(FILLER, "And which river runs through Madrid?")
    await settle(report)
    kv = view.apply(report.drain())
    h1, h2 = block_hashes(t1, BS), block_hashes(t2, BS)
    shared = leading_shared(h1, h2)
    assert 0 < shared < len(h2)
    assert kv is not None and kv.stored == h2[shared:] and not kv.cleared and kv.removed is None
    assert view.blocks == set(h1) | set(h2) == set(report.held)
    assert (await sim.state())["cached_blocks"] == len(view.blocks)
    assert listener.lost == 0 and listener.blocks is not None and listener.blocks.counters.orphans == 0

    # Nothing changed: the batch still goes out (the worker reports), empty.
    kv = view.apply(report.drain())
    assert kv is not None and (kv.stored, kv.removed, kv.cleared) == (None, None, False)
    assert json.loads(kv.to_json()) == {"seq": 3, "block_size": BS}


async def test_evictions_are_reported_as_removed(sims, listeners) -> None:
    report = KVReport()
    listener = listeners(report)
    sim = await sims("--kv-events", listener.engine_endpoint, "--kv-blocks", "24")
    view = LeaderView()
    stored_ever: list[str] = []
    prompts = []
    for i in range(4):  # ~8 blocks each in a pool of 24: the fourth evicts the first
        tokens = await sim.chat(f"Conversation {i}. " + FILLER, f"Question {i}?")
        prompts.append(block_hashes(tokens, BS))
        await settle(report)
        kv = view.apply(report.drain())
        assert kv is not None and not kv.cleared
        stored_ever += kv.stored or []
        assert set(kv.removed or ()) <= set(stored_ever)
        assert (await sim.state())["cached_blocks"] == len(view.blocks) == len(report.held)
    assert view.blocks <= set().union(*map(set, prompts))
    assert set(prompts[-1]) <= view.blocks
    assert set(prompts[0]) - view.blocks, "nothing was evicted"
    assert listener.blocks is not None and listener.blocks.counters.removed > 0


async def test_reset_prefix_cache_is_reported_as_cleared(sims, listeners) -> None:
    report = KVReport()
    listener = listeners(report)
    sim = await sims("--kv-events", listener.engine_endpoint)
    view = LeaderView()
    await sim.chat(FILLER, "First question?")
    await settle(report)
    view.apply(report.drain())
    assert view.blocks

    r = await sim.client.post(sim.url + "/reset_prefix_cache")
    assert r.json() == {"success": True}
    # vLLM publishes the clear with the next scheduler step, ahead of that step's stores.
    t = await sim.chat("Another system prompt entirely. " + FILLER, "Second question?")
    await settle(report)
    kv = view.apply(report.drain())
    assert kv is not None and kv.cleared and kv.stored == block_hashes(t, BS) and kv.removed is None
    assert view.blocks == set(block_hashes(t, BS))
    assert (await sim.state())["cached_blocks"] == len(view.blocks)
    assert listener.blocks is not None and listener.blocks.counters.resets == 1


async def test_an_engine_restart_is_reported_as_cleared(sims, listeners) -> None:
    report = KVReport()
    listener = listeners(report)
    sim = await sims("--kv-events", listener.engine_endpoint)
    view = LeaderView()
    await sim.chat(FILLER, "Before the crash?")
    await sim.chat("Something else. " + FILLER, "Still before?")
    await settle(report)
    view.apply(report.drain())

    await sim.kill()
    again = await sims("--kv-events", listener.engine_endpoint)  # counts batches from 0 again, dialling the same socket
    t = await again.chat("After the restart. " + FILLER, "Is it empty?")
    await settle(report)
    kv = view.apply(report.drain())
    assert kv is not None and kv.cleared and kv.stored == block_hashes(t, BS)
    assert view.blocks == set(block_hashes(t, BS)) == set(report.held)
    assert listener.lost == 1 and "restarted" in listener.blocks.counters.last_reset  # type: ignore[union-attr]


async def test_missed_batches_come_from_the_replay_socket(sims, listeners) -> None:
    port, replay = _free_port(), _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    sim = await sims("--kv-events", endpoint, "--kv-events-replay", f"tcp://*:{replay}")
    t0 = await sim.chat(FILLER, "Said while nobody listened?")  # batch 0: no subscriber, dropped

    report = KVReport()
    listener = listeners(report, endpoint=endpoint, replay_endpoint=f"tcp://*:{replay}")
    assert listener.engine_endpoint == endpoint  # no wildcard: the engine dials, the listener binds
    said = [t0]
    for i in range(20):  # until the engine's socket has found ours
        said.append(await sim.chat(FILLER, f"Follow-up number {i}?"))
        await settle(report, quiet=0.2)
        if report.held:
            break
    view = LeaderView()
    kv = view.apply(report.drain())
    assert kv is not None and not kv.cleared
    assert view.blocks == set().union(*(block_hashes(t, BS) for t in said))
    assert (await sim.state())["cached_blocks"] == len(view.blocks)
    assert listener.replayed >= 1 and listener.lost == 0
    assert listener.blocks is not None and listener.blocks.counters.orphans == 0


async def test_without_replay_a_gap_after_known_blocks_is_cleared(listeners) -> None:
    """A fake engine skips a batch: the blocks known before are forgotten, and the orphan is not guessed at."""
    report = KVReport()
    listener = listeners(report)
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(listener.engine_endpoint)
    try:
        first = list(range(100, 132))
        await _publish_until_heard(pub, listener, _batch([_stored([11, 12], None, first)]))
        view = LeaderView()
        view.apply(report.drain())
        assert view.blocks == set(block_hashes(first, BS))

        await pub.send_multipart([b"", struct.pack(">Q", 2), _batch([_stored([13], 12, list(range(16)))])])
        await settle(report, quiet=0.2)
        kv = view.apply(report.drain())
        assert kv is not None and kv.cleared and kv.stored is None and not view.blocks
        assert listener.lost == 1 and listener.blocks is not None and listener.blocks.counters.orphans == 1

        # An unreadable batch: the same (the leader rebuilds from what follows).
        await pub.send_multipart([b"", struct.pack(">Q", 3), _batch([_stored([21], None, first[:16])])])
        await pub.send_multipart([b"", struct.pack(">Q", 4), b"\xc1 not msgpack"])
        await settle(report, quiet=0.2)
        kv = view.apply(report.drain())
        assert kv is not None and kv.cleared and not view.blocks and listener.lost == 2
    finally:
        pub.close(0)
        ctx.term()


async def test_pending_changes_stay_bounded(sims, listeners) -> None:
    report = KVReport(max_pending=10)
    listener = listeners(report)
    sim = await sims("--kv-events", listener.engine_endpoint)
    view = LeaderView()
    tokens = await sim.chat(FILLER * 3, "A long one?")
    assert len(block_hashes(tokens, BS)) > 15
    await settle(report)
    assert report.pending <= 11 and report.overflows >= 1
    kv = view.apply(report.drain())
    assert kv is not None and kv.cleared and len(kv.stored or ()) <= 10
    assert view.blocks <= set(report.held) == set(block_hashes(tokens, BS))


# --- the report on its own -----------------------------------------------------------------------------


def test_a_block_stored_and_removed_in_one_window_cancels_out() -> None:
    report = KVReport()
    blocks = EngineBlocks(report)
    toks = list(range(64))
    h = block_hashes(toks, BS)
    blocks.apply([_event_stored([1, 2], None, toks[:32])])
    blocks.apply([BlockRemoved((2,))])
    kv = report.drain()
    assert kv is not None and kv.stored == h[:1] and kv.removed is None and kv.seq == 1

    blocks.apply([BlockRemoved((1,))])
    blocks.apply([_event_stored([1], None, toks[:16])])  # gone and back inside one window: nothing to say
    kv = report.drain()
    assert kv is not None and (kv.stored, kv.removed, kv.seq) == (None, None, 2)
    blocks.apply([BlockRemoved((99,))])
    assert blocks.counters.unknown_removed == 1 and report.pending == 0


def test_two_engines_holding_one_block_report_it_once() -> None:
    report = KVReport()
    a, b = EngineBlocks(report, "a"), EngineBlocks(report, "b")
    toks = list(range(16))
    a.apply([_event_stored([1], None, toks)])
    b.apply([_event_stored([7], None, toks)])
    view = LeaderView()
    assert view.apply(report.drain()).stored == block_hashes(toks, BS)  # type: ignore[union-attr]
    a.apply([BlockRemoved((1,))])
    assert report.pending == 0  # b still holds it
    a.release()  # one engine stopped: the other's blocks stay
    kv = view.apply(report.drain())
    assert kv is not None and not kv.cleared and kv.removed is None and view.blocks == set(block_hashes(toks, BS))
    b.reset("test")  # cleared: the leader forgets all, then hears what other engines still hold (none here)
    kv = view.apply(report.drain())
    assert kv is not None and kv.cleared and not view.blocks


def test_the_pending_bound_holds_and_keeps_the_oldest_blocks() -> None:
    report = KVReport(max_pending=50)
    blocks = EngineBlocks(report)
    toks = list(range(16 * 200))
    for i in range(200):
        blocks.apply([_event_stored([1000 + i], None if i == 0 else 999 + i, toks[i * 16 : (i + 1) * 16])])
        assert report.pending <= 51
    assert report.overflows >= 1 and len(report.held) == 200
    view = LeaderView()
    kv = view.apply(report.drain())
    assert kv is not None and kv.cleared and len(kv.stored or ()) <= 50
    chain = block_hashes(toks, BS)
    assert kv.stored[:25] == chain[:25]  # type: ignore[index]  # the longest-held prefix blocks come first
    assert view.blocks <= set(chain)


def test_a_failed_heartbeat_makes_the_next_batch_start_over() -> None:
    report = KVReport()
    blocks = EngineBlocks(report)
    toks = list(range(48))
    blocks.apply([_event_stored([1, 2, 3], None, toks)])
    report.drain()  # lost on the way
    report.resync()
    kv = report.drain()
    assert kv is not None and kv.seq == 2 and kv.cleared and kv.stored == block_hashes(toks, BS)


def test_no_kv_blocks_without_an_engine_that_reports() -> None:
    report = KVReport()
    assert report.drain() is None and report.seq == 0  # no engine listening: no statement
    blocks = EngineBlocks(report)
    assert report.drain() is not None  # an engine reports: every heartbeat says so, changes or not
    blocks.apply([_event_stored([1], None, list(range(16)))])
    report.drain()
    blocks.release()
    kv = report.drain()  # its blocks leaving is said once…
    assert kv is not None and (kv.cleared or kv.removed == block_hashes(list(range(16)), BS))
    assert report.drain() is None  # …then nothing


def test_blocks_keyed_by_more_than_tokens_are_not_reported() -> None:
    report = KVReport()
    blocks = EngineBlocks(report)
    toks = list(range(48))
    salted = BlockStored((1, 2), None, toks[:32], BS, (False, True))
    blocks.apply([salted, _event_stored([3], 2, toks[32:])])  # its child chains from a salted block
    other_tier = BlockStored((4,), None, toks[:16], BS, (True,), tracked=False)
    blocks.apply([other_tier])
    assert report.pending == 0 and blocks.counters.not_plain == 2 and blocks.counters.untracked == 1
    blocks.apply([BlockRemoved((1,)), BlockRemoved((3,))])
    assert blocks.counters.unknown_removed == 0  # known, just not reportable


async def test_early_heartbeats_are_debounced() -> None:
    kicks: list[float] = []
    report = KVReport(on_pending=lambda: kicks.append(time.monotonic()), min_interval=0.3)
    blocks = EngineBlocks(report)
    toks = list(range(16 * 40))
    start = time.monotonic()
    for i in range(40):  # a change every 25 ms for a second; each kick is answered by a heartbeat
        blocks.apply([_event_stored([i + 1], i or None, toks[i * 16 : (i + 1) * 16])])
        await asyncio.sleep(0.025)
        if kicks and report.pending and kicks[-1] > start:
            report.drain()
            start = time.monotonic()
    await asyncio.sleep(0.4)
    assert 3 <= len(kicks) <= 5, kicks
    assert all(b - a >= 0.28 for a, b in itertools.pairwise(kicks)), kicks
    report.close()


# --- vLLM's wire ------------------------------------------------------------------------------------------


def test_bind_or_connect_follows_vllms_rule_as_the_simulator_does() -> None:
    for endpoint in ("tcp://*:5557", "tcp://[::]:5557", "tcp://127.0.0.1:5557", "tcp://10.0.0.2:5557", "ipc:///tmp/kv",
                     "inproc://kv", "tcp://localhost:5557"):
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
        decode_payload(msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                             "token_ids": "abc", "block_size": 16}], 0]))
    # Older vLLM's tagged arrays, and an event type this worker does not know, are read (the latter skipped).
    events = decode_payload(msgpack.packb([1.0, [["BlockStored", [5], None, list(range(16)), 16, None, "GPU"],
                                                 ["BlockRemoved", [5], "GPU"], {"type": "SomethingNew"}], 0]))
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
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(listener.engine_endpoint)
    view = LeaderView()
    try:
        # The first batch is sent until it is heard (the subscription takes a moment to reach the publisher).
        await _publish_until_heard(pub, listener, (RECORDED / items[0]["file"]).read_bytes(), topic=b"kv-events")
        for item in items[1:]:
            f = item["frames"]
            await pub.send_multipart([bytes.fromhex(f["frame0_topic_hex"]), bytes.fromhex(f["frame1_seq_hex"]),
                                      (RECORDED / item["file"]).read_bytes()])
        await settle(report)
        view.apply(report.drain())
    finally:
        pub.close(0)
        ctx.term()
    # Resets: AllBlocksCleared at 12, the gap before 38 (whose 40 removals name blocks forgotten there),
    # the gap before 45, and 45's two AllBlocksCleared.
    assert listener.lost == 2 and listener.blocks is not None
    assert listener.blocks.counters.resets == 5
    assert listener.blocks.counters.unknown_removed == 40
    assert view.cleared == 1 and view.seq == 1
    assert not view.blocks and not report.held


# --- the worker: engine manager and heartbeat -------------------------------------------------------------


async def test_a_worker_reports_its_sim_engines_blocks_in_heartbeats(tmp_path: Path) -> None:
    supervisor = Supervisor()
    kicks: list[float] = []
    manager = EngineManager(engine_id="sim", home=tmp_path, catalog=load_catalog(), supervisor=supervisor,
                            flags={"time_scale": 0}, on_change=lambda: kicks.append(time.monotonic()))
    agent = Agent(leader_url="http://127.0.0.1:9", node_id="n1", token="t", boot_id="b1", address="127.0.0.1:1",
                  capabilities=nodeapi.Capabilities(), manager=manager)
    view = LeaderView()
    try:
        body = (await agent.heartbeat_body()).to_wire()
        assert "kv_blocks" not in body  # nothing loaded: no engine reports yet
        engine = await load_and_serve(manager, "sim-model")
        assert engine.spec is not None and engine.spec.kv_events_endpoint.startswith("tcp://127.0.0.1:")
        assert engine.kv is not None
        await asyncio.sleep(0.5)

        async with httpx.AsyncClient(timeout=10) as client:
            tokens = await chat(client, engine.base_url, FILLER, "Through the worker?")
            assert manager.kv_report is not None
            await settle(manager.kv_report)
            kicked = len(kicks)
            body = await agent.heartbeat_body()
            kv = view.apply(body.kv_blocks)
            assert kv is not None and kv.stored == block_hashes(tokens, BS) and not kv.cleared
            assert kicked >= 1  # the changes asked for an early heartbeat

            # No leader answers at that address: the batch in that heartbeat may be lost, so the next starts over.
            with pytest.raises((aiohttp.ClientError, OSError)):
                await agent.beat()
            kv = manager.kv_blocks()
            assert kv is not None and kv.seq == view.seq + 2 and kv.cleared and kv.stored == block_hashes(tokens, BS)
            view.seq += 1  # (a leader would have seen the gap too, and the batch says cleared)
            view.apply(kv)

            # The supervisor relaunches a killed engine: its cache is empty, whatever was said before.
            process = supervisor.get(engine.process_id)
            assert process is not None and process.pid
            os.killpg(process.pid, signal.SIGKILL)
            for _ in range(400):
                await asyncio.sleep(0.05)
                if process.ready and process.restarts == 1:
                    break
            assert process.restarts == 1 and process.ready
            kv = view.apply((await agent.heartbeat_body()).kv_blocks)
            assert kv is not None and kv.cleared and not view.blocks

        port = int(engine.spec.kv_events_endpoint.rsplit(":", 1)[1])
        await manager.unload(nodeapi.UnloadModelRequest(id="sim-model"))
        assert engine.kv is None and manager.kv_report.sources == 0
        # Nothing left behind: the listener's task has ended and its port is free again.
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("kv-events")]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
        view.apply((await agent.heartbeat_body()).kv_blocks)
        assert "kv_blocks" not in (await agent.heartbeat_body()).to_wire()  # no engine reports any more
    finally:
        await manager.stop_all()
        await agent.close()


async def test_a_worker_whose_engine_publishes_nothing_never_sends_the_key(tmp_path: Path) -> None:
    manager = EngineManager(engine_id="llamacpp", home=tmp_path, catalog=load_catalog(), supervisor=Supervisor())
    assert manager.kv_report is None and manager.kv_blocks() is None
    agent = Agent(leader_url="http://127.0.0.1:9", node_id="n1", token="t", boot_id="b1", address="127.0.0.1:1",
                  capabilities=nodeapi.Capabilities(), manager=manager)
    try:
        assert "kv_blocks" not in (await agent.heartbeat_body()).to_wire()
    finally:
        await manager.stop_all()
        await agent.close()


# --- fake-engine helpers ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stored(hashes: list[int], parent: int | None, tokens: list[int], size: int = BS) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": size, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None] * len(hashes),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def _event_stored(hashes: list[int], parent: int | None, tokens: list[int]) -> BlockStored:
    (event,) = decode_payload(_batch([_stored(hashes, parent, tokens)]))
    assert isinstance(event, BlockStored)
    return event


def _batch(events: list[dict[str, Any]]) -> bytes:
    return msgpack.packb([time.time(), events, 0], use_bin_type=True)


async def _publish_until_heard(pub: zmq.asyncio.Socket, listener: KVEventListener, payload: bytes, topic: bytes = b"") -> None:
    """Send batch 0 until the listener has it: a PUB drops messages until the subscription reaches it."""
    assert listener.blocks is not None
    for _ in range(50):
        await pub.send_multipart([topic, struct.pack(">Q", 0), payload])
        await asyncio.sleep(0.1)  # long enough that a second copy is never sent after the first was heard
        if listener.blocks.counters.batches:
            return
    raise AssertionError("the listener never heard the fake engine")
