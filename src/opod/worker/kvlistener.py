"""One engine's KV-cache events, received on ZMQ in the worker's event loop: vLLM 0.32's wire.

Messages are frames ``[topic, seq as 8-byte big-endian, payload]``; the
payload is a msgpack array ``[ts, [events], dp_rank]`` whose events are maps
tagged ``type`` (older releases sent tagged arrays; both are read).

Bind or connect: vLLM's PUB socket binds when its endpoint has a wildcard
(``*`` or ``::``) or is ``ipc://``/``inproc://``, and connects otherwise; its
replay ROUTER always binds. The listener takes the other side of each:

* no endpoint given (how the worker uses it): the SUB socket binds an
  OS-chosen loopback port and the engine is told ``tcp://127.0.0.1:PORT``. That
  has no wildcard, so the engine dials in: no port can be taken between
  choosing and using it, and an engine restarted by the supervisor dials the
  same socket again;
* an endpoint the engine binds: the SUB connects to it (a wildcard host means
  this machine); an endpoint the engine connects to: the SUB binds it.

Batches carry the engine's counter (from 0, +1 per batch, from 0 again after a
restart). A batch that arrives early means some never came: they are asked of
the replay socket when the engine has one, and otherwise (or when its buffer no
longer reaches back) the engine's blocks are forgotten and the leader told
``cleared``. A counter that goes back, a process the supervisor relaunched, or
an unreadable message do the same. Either way the index rebuilds from what
follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import struct
import time
from collections.abc import Sequence

import msgpack
import zmq
import zmq.asyncio

from opod.http import cpu
from opod.worker.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlocks,
    EngineHash,
    Event,
    KVReport,
)

__all__ = [
    "KVDecodeError",
    "KVEventListener",
    "KVListenError",
    "decode_payload",
    "dial_address",
    "engine_binds",
    "split_message",
]

log = logging.getLogger("opod.worker")

RCVHWM = 100_000
"""Messages queued before ZMQ drops them: vLLM's own send high-water mark."""
REPLAY_TIMEOUT = 2.0

_SEQ = struct.Struct(">Q")
_END = b"\xff" * 8
"""Sequence frame of the replay's end marker (-1 as a signed 64-bit integer)."""
_WILDCARD_HOST = re.compile(r"^tcp://(\*|\[::\]|::)(?=:\d+$)")
_TRACKED_MEDIUMS = (None, "GPU")
"""Blocks in the engine's own cache; offload tiers (``CPU``, ``STORAGE``) report the same hashes again."""

# Field order of the tagged-array events older vLLM releases sent (``array_like=True``).
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


class KVDecodeError(ValueError):
    """A message or batch that is not vLLM's KV-event format; the message says what was wrong."""


class KVListenError(RuntimeError):
    """The listener's sockets could not be opened; the message names the endpoint and ZMQ's reason."""


def engine_binds(endpoint: str) -> bool:
    """vLLM's rule: does the engine bind this endpoint (else it connects to it)?"""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def dial_address(endpoint: str) -> str:
    """Where to connect to an endpoint an engine binds on this machine (``tcp://*:5557`` → ``tcp://127.0.0.1:5557``)."""
    return _WILDCARD_HOST.sub("tcp://127.0.0.1", endpoint)


# --- the wire -----------------------------------------------------------------------------------


def split_message(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """``[topic, seq, payload]`` → ``(seq, payload)``; the topic is not checked (the socket is ours alone)."""
    if len(frames) != 3:
        raise KVDecodeError(f"a KV-event message has 3 frames [topic, seq, payload]; this one has {len(frames)}")
    if len(frames[1]) != 8:
        raise KVDecodeError(f"the sequence frame is {len(frames[1])} bytes; vLLM sends 8 (big-endian)")
    return _SEQ.unpack(frames[1])[0], frames[2]


def decode_payload(payload: bytes) -> list[Event]:
    """One batch's events, in the engine's order. Unknown event types are skipped (a newer engine's additions)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise KVDecodeError(f"the payload is not msgpack ({err})") from None
    if not isinstance(batch, list) or len(batch) not in (2, 3) or not isinstance(batch[1], list):
        raise KVDecodeError("the payload is not a batch [ts, [events], data_parallel_rank]")
    out: list[Event] = []
    for i, raw in enumerate(batch[1]):
        try:
            event = _event(raw)
        except (KeyError, TypeError, ValueError) as err:
            raise KVDecodeError(f"event {i} of the batch: {err}") from None
        if event is not None:
            out.append(event)
    return out


def _event(raw: object) -> Event | None:
    if isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind = raw[0]
        fields = dict(zip(_ARRAY_FIELDS.get(kind, ()), raw[1:]))
    else:
        raise TypeError("an event is a map with a 'type' key (or a tagged array)")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    if kind not in ("BlockStored", "BlockRemoved"):
        return None
    hashes = _hashes(fields["block_hashes"])
    tracked = fields.get("medium") in _TRACKED_MEDIUMS and fields.get("group_idx", 0) in (None, 0)
    if kind == "BlockRemoved":
        return BlockRemoved(hashes, tracked)
    parent = fields.get("parent_block_hash")
    if parent is not None:
        parent = _hashes([parent])[0]
    tokens = fields["token_ids"]
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise TypeError("token_ids must be a list of integers")
    size = fields["block_size"]
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError("block_size must be an integer")
    lora = fields.get("lora_id") is not None or fields.get("lora_name") is not None
    extra = fields.get("extra_keys") or []
    if not isinstance(extra, list):
        raise TypeError("extra_keys must be a list (one entry per block)")
    plain = tuple(not lora and (i >= len(extra) or extra[i] is None) for i in range(len(hashes)))
    return BlockStored(hashes, parent, tokens, size, plain, tracked)


def _hashes(value: object) -> tuple[EngineHash, ...]:
    if not isinstance(value, list) or not all(isinstance(h, (int, bytes)) and not isinstance(h, bool) for h in value):
        raise TypeError("block hashes must be a list of integers or byte strings")
    return tuple(value)


# --- the listener --------------------------------------------------------------------------------


class KVEventListener:
    """Receives one engine's events and keeps its blocks in ``report``; ``start`` it, ``close`` it when the engine stops."""

    def __init__(
        self,
        report: KVReport,
        *,
        name: str = "engine",
        endpoint: str = "",
        replay_endpoint: str = "",
        replay_timeout: float = REPLAY_TIMEOUT,
    ) -> None:
        self.report = report
        self.name = name
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.replay_timeout = replay_timeout
        self.blocks: EngineBlocks | None = None
        self.engine_endpoint = ""
        """What the engine is configured with (``--kv-events-config``'s endpoint)."""
        self.lost = 0
        """Times events were lost (gaps replay could not fill, restarts, unreadable messages)."""
        self.replayed = 0
        """Batches the replay socket filled in."""
        self._ctx: zmq.asyncio.Context | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._expected: int | None = None
        """The next batch number; ``None``: not known (nothing yet, or since a restart)."""
        self._dup: tuple[int, int] | None = None
        """Batches a replay applied whose live copies may still be queued: skip them."""
        self._applied = False
        """Something was applied since the last reset (a reset before that would tell the leader nothing)."""
        self._synced_at = 0.0
        """Unix time of the last batch 0 or reset: a process started before it is the one being heard."""

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Open the sockets and start receiving (in the running loop); returns the endpoint to give the engine."""
        if self._task is not None:
            return self.engine_endpoint
        where = self.endpoint or "tcp://127.0.0.1:*"
        ctx = zmq.asyncio.Context()
        for free in cpu.free_cpus():  # its threads start with the first socket: not on the leader's loop's CPU
            ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, free)
        try:
            sub = ctx.socket(zmq.SUB)
        except zmq.ZMQError as err:  # out of file descriptors, most likely
            ctx.term()
            raise KVListenError(f"cannot listen for {self.name}'s KV events: {err}") from None
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCVHWM)
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # the socket is this engine's alone: every topic is ours
        try:
            if self.endpoint and engine_binds(self.endpoint):
                sub.connect(dial_address(self.endpoint))
                self.engine_endpoint = self.endpoint
            else:
                sub.bind(where)
                self.engine_endpoint = self.endpoint or sub.getsockopt_string(zmq.LAST_ENDPOINT)
            self._ctx, self._sub = ctx, sub
            if self.replay_endpoint:
                where = self.replay_endpoint
                self._open_dealer()
        except zmq.ZMQError as err:
            sub.close(0)
            if self._dealer is not None:
                self._dealer.close(0)
                self._dealer = None
            ctx.term()
            self._ctx = self._sub = None
            raise KVListenError(f"cannot listen for {self.name}'s KV events on {where}: {err}") from None
        self.blocks = EngineBlocks(self.report, self.name)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-events-{self.name}")
        return self.engine_endpoint

    async def close(self) -> None:
        """Stop receiving, close the sockets, and take this engine's blocks out of the report."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for sock in (self._sub, self._dealer):
            if sock is not None:
                sock.close(0)
        self._sub = self._dealer = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self.blocks is not None:
            self.blocks.release()

    def engine_started(self, at: float) -> None:
        """The engine's process was (re)started at ``at`` (unix time); what was heard from an earlier one is stale."""
        if at > self._synced_at and self._applied:
            self._lose("the engine process was started again")
            self._expected = None

    def engine_exited(self) -> None:
        """The engine's process is not running: its cache went with it."""
        if self._applied or self._expected is not None:
            self._lose("the engine process exited")
            self._expected = None

    # --- receiving -------------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._sub is not None
        while True:
            try:
                frames = await self._sub.recv_multipart()
            except zmq.ZMQError as err:
                log.warning("KV events of %s: the socket failed (%s); no more events from this engine", self.name, err)
                return
            try:
                await self._handle(frames)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not end the listener quietly with the index wrong
                log.exception("KV events of %s: a batch could not be handled", self.name)
                self._lose("a batch could not be handled")
                self._expected = None

    async def _handle(self, frames: Sequence[bytes]) -> None:
        try:
            seq, payload = split_message(frames)
        except KVDecodeError as err:
            self._lose(f"an unreadable message ({err})")
            self._expected = None
            return
        expected = self._expected
        if expected is not None and seq < expected:
            if self._dup is not None and self._dup[0] <= seq < self._dup[1]:
                return  # a replay brought it already
            self._lose(f"the engine restarted (its batch counter went from {expected - 1} back to {seq})")
            expected = self._expected = None
        self._dup = None
        start = 0 if expected is None else expected
        if seq > start:
            if not await self._replay(start, seq):
                self._lose(f"batches {start}–{seq - 1} never arrived")
            if self._expected is not None and seq < self._expected:
                return
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        assert self.blocks is not None
        try:
            events = decode_payload(payload)
        except KVDecodeError as err:
            self._lose(f"batch {seq} is unreadable ({err})")
        else:
            self.blocks.apply(events)
            self._applied = True
        self._expected = seq + 1
        if seq == 0:
            self._synced_at = time.time()

    def _lose(self, reason: str) -> None:
        """Events were lost: forget this engine's blocks (the leader hears ``cleared``) unless nothing was known."""
        self.lost += 1
        self._synced_at = time.time()
        if self._applied and self.blocks is not None:
            self.blocks.reset(reason)
        else:
            log.info("KV events of %s: %s", self.name, reason)
        self._applied = False

    # --- replay ------------------------------------------------------------------------------------

    def _open_dealer(self) -> None:
        assert self._ctx is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(dial_address(self.replay_endpoint))  # the replay ROUTER always binds
        self._dealer = dealer

    async def _replay(self, start: int, until: int) -> bool:
        """Ask the engine for batches ``start``… and apply them; True when ``start``…``until - 1`` all came."""
        if self._dealer is None:
            return False
        got = start
        broken = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replay_timeout
        try:
            await self._dealer.send_multipart([b"", _SEQ.pack(start)])
            while True:
                frames = await asyncio.wait_for(self._dealer.recv_multipart(), max(0.01, deadline - loop.time()))
                if len(frames) != 4:
                    raise KVDecodeError(
                        f"a replay answer has 4 frames [empty, topic, seq, payload]; this one has {len(frames)}"
                    )
                raw_seq, payload = frames[2], frames[3]
                if raw_seq == _END:
                    break
                seq = _SEQ.unpack(raw_seq)[0]
                if broken or seq < got:
                    continue
                if seq != got:
                    broken = True  # the buffer no longer reaches back this far; read on to the end marker
                    continue
                self._apply(seq, payload)
                got += 1
                self.replayed += 1
        except (TimeoutError, zmq.ZMQError, KVDecodeError, struct.error) as err:
            log.warning(
                "KV events of %s: replay from batch %d failed (%s)", self.name, start, err or type(err).__name__
            )
            self._dealer.close(0)  # a late answer must not be read as the next replay's
            self._open_dealer()
            broken = True
        if got > start:
            self._dup = (start, got)
        return not broken and got >= until
