"""A worker's KV-cache events → the contract's block hashes: the listener against the real simulator
(``python -m opod sim --kv-events …`` as a child process), and the report on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
import time

from bench.ports import free_port
from opod.contract.blockhash import block_hashes
from opod.worker.kvevents import BlockRemoved, BlockStored, EngineBlocks, KVReport
from opod.worker.kvlistener import engine_binds
from tests.worker.kv_support import (
    BS,
    FILLER,
    LeaderView,
    batch,
    decoded_stored,
    fake_engine_pub,
    leading_shared,
    publish_until_heard,
    settle,
    stored_event,
)

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
    port, replay = free_port(), free_port()
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
    async with fake_engine_pub(listener) as pub:
        first = list(range(100, 132))
        await publish_until_heard(pub, listener, batch([stored_event([11, 12], None, first)]))
        view = LeaderView()
        view.apply(report.drain())
        assert view.blocks == set(block_hashes(first, BS))

        await pub.send_multipart([b"", struct.pack(">Q", 2), batch([stored_event([13], 12, list(range(16)))])])
        await settle(report, quiet=0.2)
        kv = view.apply(report.drain())
        assert kv is not None and kv.cleared and kv.stored is None and not view.blocks
        assert listener.lost == 1 and listener.blocks is not None and listener.blocks.counters.orphans == 1

        # An unreadable batch: the same (the leader rebuilds from what follows).
        await pub.send_multipart([b"", struct.pack(">Q", 3), batch([stored_event([21], None, first[:16])])])
        await pub.send_multipart([b"", struct.pack(">Q", 4), b"\xc1 not msgpack"])
        await settle(report, quiet=0.2)
        kv = view.apply(report.drain())
        assert kv is not None and kv.cleared and not view.blocks and listener.lost == 2


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
    blocks.apply([decoded_stored([1, 2], None, toks[:32])])
    blocks.apply([BlockRemoved((2,))])
    kv = report.drain()
    assert kv is not None and kv.stored == h[:1] and kv.removed is None and kv.seq == 1

    blocks.apply([BlockRemoved((1,))])
    blocks.apply([decoded_stored([1], None, toks[:16])])  # gone and back inside one window: nothing to say
    kv = report.drain()
    assert kv is not None and (kv.stored, kv.removed, kv.seq) == (None, None, 2)
    blocks.apply([BlockRemoved((99,))])
    assert blocks.counters.unknown_removed == 1 and report.pending == 0


def test_two_engines_holding_one_block_report_it_once() -> None:
    report = KVReport()
    a, b = EngineBlocks(report, "a"), EngineBlocks(report, "b")
    toks = list(range(16))
    a.apply([decoded_stored([1], None, toks)])
    b.apply([decoded_stored([7], None, toks)])
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
        blocks.apply([decoded_stored([1000 + i], None if i == 0 else 999 + i, toks[i * 16 : (i + 1) * 16])])
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
    blocks.apply([decoded_stored([1, 2, 3], None, toks)])
    report.drain()  # lost on the way
    report.resync()
    kv = report.drain()
    assert kv is not None and kv.seq == 2 and kv.cleared and kv.stored == block_hashes(toks, BS)


def test_no_kv_blocks_without_an_engine_that_reports() -> None:
    report = KVReport()
    assert report.drain() is None and report.seq == 0  # no engine listening: no statement
    blocks = EngineBlocks(report)
    assert report.drain() is not None  # an engine reports: every heartbeat says so, changes or not
    blocks.apply([decoded_stored([1], None, list(range(16)))])
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
    blocks.apply([salted, decoded_stored([3], 2, toks[32:])])  # its child chains from a salted block
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
        blocks.apply([decoded_stored([i + 1], i or None, toks[i * 16 : (i + 1) * 16])])
        await asyncio.sleep(0.025)
        if kicks and report.pending and kicks[-1] > start:
            report.drain()
            start = time.monotonic()
    await asyncio.sleep(0.4)
    assert 3 <= len(kicks) <= 5, kicks
    assert all(b - a >= 0.28 for a, b in itertools.pairwise(kicks)), kicks
    report.close()
