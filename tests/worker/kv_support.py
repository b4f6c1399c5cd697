"""Helpers for the KV-event tests: a leader's view of the batches, simulators as child processes, a fake engine's frames."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack
import zmq
import zmq.asyncio

from opod.contract import nodeapi
from opod.worker.kvevents import BlockStored, KVReport
from opod.worker.kvlistener import (
    KVEventListener,
    decode_payload,
)

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
    r = await client.post(
        url + "/v1/chat/completions", json={"model": "sim-model", "messages": messages, "max_tokens": 1}
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokens)
    return tokens


async def start_sim(*args: str) -> Sim:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "opod",
        "sim",
        "--port",
        "0",
        "--time-scale",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=REPO,
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


# --- fake-engine helpers ----------------------------------------------------------------------------------


def stored_event(hashes: list[int], parent: int | None, tokens: list[int], size: int = BS) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def decoded_stored(hashes: list[int], parent: int | None, tokens: list[int]) -> BlockStored:
    (event,) = decode_payload(batch([stored_event(hashes, parent, tokens)]))
    assert isinstance(event, BlockStored)
    return event


def batch(events: list[dict[str, Any]]) -> bytes:
    return msgpack.packb([time.time(), events, 0], use_bin_type=True)


@contextlib.asynccontextmanager
async def fake_engine_pub(listener: KVEventListener) -> AsyncIterator[zmq.asyncio.Socket]:
    """A PUB socket dialling the listener as an engine would; closed when the block ends."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(listener.engine_endpoint)
    try:
        yield pub
    finally:
        pub.close(0)
        ctx.term()


async def publish_until_heard(
    pub: zmq.asyncio.Socket, listener: KVEventListener, payload: bytes, topic: bytes = b""
) -> None:
    """Send batch 0 until the listener has it: a PUB drops messages until the subscription reaches it."""
    assert listener.blocks is not None
    for _ in range(50):
        await pub.send_multipart([topic, struct.pack(">Q", 0), payload])
        await asyncio.sleep(0.1)  # long enough that a second copy is never sent after the first was heard
        if listener.blocks.counters.batches:
            return
    raise AssertionError("the listener never heard the fake engine")
