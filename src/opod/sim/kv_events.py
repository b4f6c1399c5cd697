"""KV-cache events on ZMQ, framed exactly as vLLM 0.32 publishes them.

* PUB socket: multipart ``[topic, seq as 8-byte big-endian, payload]``; ``seq``
  counts batches from 0. Like vLLM, the socket binds when the endpoint has a
  wildcard (``*`` or ``::``) or is ``ipc://``/``inproc://``, and connects otherwise.
* An extra endpoint the same PUB socket always binds (``--kv-events-bind``): an
  outside subscriber such as vllm-router dials it while the opod worker's own
  listener keeps receiving through the first endpoint. One socket sends every
  frame to every peer, so both see the same batches with the same ``seq``.
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

__all__ = ["KVEventPublisher", "KVEventsError", "binds", "encode_batch"]

_SEQ = struct.Struct(">Q")
_END_SEQ = _SEQ.pack(0xFFFFFFFFFFFFFFFF)


def binds(endpoint: str) -> bool:
    """vLLM's rule for whether the PUB socket binds or connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def encode_batch(ts: float, events: list[dict[str, Any]], dp_rank: int = 0) -> bytes:
    return msgpack.packb([float(ts), events, dp_rank], use_bin_type=True)


class KVEventsError(RuntimeError):
    """A KV-event socket could not bind or connect; ``endpoint`` says which one."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"cannot open {endpoint}: {reason}")
        self.endpoint = endpoint


class KVEventPublisher:
    """Owns the sockets; ``publish`` is called from the event loop's thread only."""

    def __init__(
        self,
        endpoint: str,
        topic: str = "",
        replay_endpoint: str = "",
        buffer_steps: int = 10000,
        bind_endpoint: str = "",
    ) -> None:
        self.endpoint = endpoint
        self.bind_endpoint = bind_endpoint
        self.topic = topic.encode()
        self.replay_endpoint = replay_endpoint
        # The PUB socket is a plain (blocking-API) socket used with NOBLOCK: sends never wait.
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._seq = 0
        self._pending: list[dict[str, Any]] = []
        self._deferred: list[dict[str, Any]] = []
        self._scheduled = False
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._replay_task: asyncio.Task[None] | None = None
        self._router: zmq.asyncio.Socket | None = None
        # Read after each bind/connect: LAST_ENDPOINT only remembers the latest one.
        self._main_at = self._bind_at = self._replay_at = ""
        try:
            if endpoint:
                self._main_at = self._open(self._pub, endpoint, bind=binds(endpoint))
            if bind_endpoint:
                self._bind_at = self._open(self._pub, bind_endpoint, bind=True)
            if replay_endpoint:
                self._router = self._actx.socket(zmq.ROUTER)
                self._router.setsockopt(zmq.LINGER, 0)
                self._replay_at = self._open(self._router, replay_endpoint, bind=True)
        except KVEventsError:
            self.close()
            raise

    @staticmethod
    def _open(sock: zmq.Socket[object], endpoint: str, bind: bool) -> str:
        try:
            if bind:
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except zmq.ZMQError as err:
            raise KVEventsError(endpoint, str(err)) from None
        return sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint

    @property
    def bound_endpoint(self) -> str:
        """Where the PUB socket's main endpoint ended up (useful with ``tcp://*:0``)."""
        return self._main_at or self.endpoint

    @property
    def extra_bound_endpoint(self) -> str:
        """Where the extra bound endpoint ended up (``tcp://127.0.0.1:*`` → the port chosen); empty when none."""
        return self._bind_at

    @property
    def replay_bound_endpoint(self) -> str:
        return self._replay_at

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
