"""KV-cache events on ZMQ, framed exactly as vLLM 0.32 publishes them.

* PUB socket: multipart ``[topic, seq as 8-byte big-endian, payload]``; ``seq``
  counts batches from 0. Like vLLM, the socket binds when the endpoint has a
  wildcard (``*`` or ``::``) or is ``ipc://``/``inproc://``, and connects otherwise.
* Payload: msgpack array ``[ts (float64), [event maps…], data_parallel_rank]``;
  each event is a map whose first key is ``type`` (built by the prefix cache).
* A batch is one "scheduler step": every event queued during one turn of the
  event loop goes out together, removals before stores as they were queued.
  ``AllBlocksCleared`` (from a reset or sleep) waits for the next step that
  schedules a request, as vLLM's does.
* Optional replay ROUTER socket (always binds): a DEALER sends ``[b"", start_seq]``
  and gets ``[b"", topic, seq, payload]`` for each buffered batch from
  ``start_seq`` on, then the end marker ``[b"", b"", seq -1, b""]``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import struct
import sys
import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio

__all__ = ["KVEventPublisher", "binds", "encode_batch"]

_SEQ = struct.Struct(">Q")
_END_SEQ = _SEQ.pack(0xFFFFFFFFFFFFFFFF)


def binds(endpoint: str) -> bool:
    """vLLM's rule for whether the PUB socket binds or connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def encode_batch(ts: float, events: list[dict[str, Any]], dp_rank: int = 0) -> bytes:
    return msgpack.packb([float(ts), events, dp_rank], use_bin_type=True)


class KVEventPublisher:
    """Owns the sockets; ``publish`` is called from the event loop's thread only."""

    def __init__(self, endpoint: str, topic: str = "", replay_endpoint: str = "", buffer_steps: int = 10000) -> None:
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.replay_endpoint = replay_endpoint
        # The PUB socket is a plain (blocking-API) socket used with NOBLOCK: sends never wait.
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.setsockopt(zmq.LINGER, 0)
        if binds(endpoint):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self._router: zmq.asyncio.Socket | None = None
        if replay_endpoint:
            self._router = self._actx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay_endpoint)
        self._seq = 0
        self._pending: list[dict[str, Any]] = []
        self._deferred: list[dict[str, Any]] = []
        self._scheduled = False
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._replay_task: asyncio.Task[None] | None = None

    @property
    def bound_endpoint(self) -> str:
        """Where the PUB socket ended up (useful with ``tcp://*:0``)."""
        return self._pub.getsockopt_string(zmq.LAST_ENDPOINT) or self.endpoint

    @property
    def replay_bound_endpoint(self) -> str:
        return self._router.getsockopt_string(zmq.LAST_ENDPOINT) if self._router is not None else ""

    def start(self) -> None:
        if self._router is not None and self._replay_task is None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Queue events for this step's batch."""
        if self._pub.closed:
            return  # shutting down: nobody is listening any more
        self._pending.extend(events)
        if not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self._flush)
            except RuntimeError:  # no loop (a request finished during shutdown): send now
                self._flush()

    def defer_cleared(self) -> None:
        """Queue ``AllBlocksCleared`` for the next scheduling step."""
        self._deferred.append({"type": "AllBlocksCleared"})

    def step(self) -> None:
        """A request was scheduled: what waited for a step joins this one."""
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            self.publish(deferred)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._pending or self._pub.closed:
            return
        events, self._pending = self._pending, []
        payload = encode_batch(time.time(), events)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            # A PUB socket drops what it cannot queue; so does vLLM's at its high-water mark.
            self._pub.send_multipart([self.topic, _SEQ.pack(seq), payload], flags=zmq.NOBLOCK)

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            try:
                frames = await self._router.recv_multipart()
            except (asyncio.CancelledError, zmq.ContextTerminated):
                return
            if len(frames) != 3 or len(frames[2]) != 8:
                print(f"opod sim: ignoring a KV-event replay request with {len(frames)} frames", file=sys.stderr)
                continue
            client, _, raw = frames
            start = _SEQ.unpack(raw)[0]
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._router.send_multipart([client, b"", self.topic, _SEQ.pack(seq), payload])
            await self._router.send_multipart([client, b"", b"", _END_SEQ, b""])

    def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)
        self._ctx.term()
        self._actx.term()
