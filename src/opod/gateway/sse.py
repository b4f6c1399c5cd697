"""A streamed answer passed on to the client as it comes: the usage chunk read (and dropped when the
client did not ask for it), the outcome reported once, and an error event when the upstream breaks off."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from opod.fleet.state import Lease
from opod.gateway.outcome import Outcome, RelayObserver
from opod.http import fastjson
from opod.http.upstream import UpstreamResponse

PROGRESS_EVERY = 1.0
"""Seconds between two progress reports of a stream (each is one journal line)."""


async def relay_sse(
    resp: UpstreamResponse,
    first: bytes,
    strip_usage: bool,
    observer: RelayObserver,
    ttft_ms: int,
    *,
    node_id: str = "",
    source: str = "",
    lease: Lease | None = None,
) -> AsyncIterator[bytes]:
    """An upstream's SSE answer, passed on as it comes; its outcome is told to ``observer`` once.

    The upstream is worker ``node_id`` (held by ``lease`` until the stream ends), or the fallback URL ``source``.
    ``ok`` at ``[DONE]`` (before the client sees the end of its answer) or at the end of the stream;
    ``error`` when the upstream breaks off (the client gets an error event naming it);
    ``cancelled`` when the client leaves, with the tokens it got. Every ``PROGRESS_EVERY`` seconds
    the tokens sent so far are told too, so a crash of the leader loses at most that much of the count.
    """
    scanner = SSEFilter(strip_usage)
    sent, reported = 0, False
    told_at = time.monotonic()

    def report(outcome: str, status: int = 200) -> None:
        nonlocal reported
        if not reported:
            reported = True
            observer.done(Outcome(status, outcome, node_id, scanner.usage, ttft_ms, sent))

    try:
        chunk: bytes | None = first
        while chunk is not None:
            out = scanner.feed(chunk)
            if out:
                # One non-empty content delta is one token on llama-server, vLLM, SGLang and the simulator:
                # what a row records as completion tokens when the stream ends before the usage chunk.
                sent += out.count(b'"content":"') - out.count(b'"content":""')
                if b"data: [DONE]" in out:
                    report("ok")
                elif (now := time.monotonic()) - told_at >= PROGRESS_EVERY:
                    told_at = now
                    observer.streaming(sent, node_id)
                yield out
            chunk = await resp.readany() or None
        tail = scanner.flush()
        if tail:
            yield tail
        report("ok")
    except (TimeoutError, OSError) as err:
        report("error", 502)
        yield interrupted_event(node_id or source, err)
    finally:
        # A client that left raises GeneratorExit/CancelledError here: the tokens it got are what it used.
        report("cancelled", 499)
        if lease is not None:
            lease.release()
        resp.release()


def interrupted_event(node_id: str, err: BaseException) -> bytes:
    error = {
        "message": f"The answer was cut off: the engine on worker {node_id} stopped mid-stream ({type(err).__name__}). Retry the request.",
        "type": "server_error",
        "code": "upstream_interrupted",
    }
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


class SSEFilter:
    """Passes SSE bytes through, dropping the usage-only chunk when the client did not ask for it.

    Events are split on blank lines; only events that mention ``"usage"`` are
    parsed, so a long stream costs a byte search per chunk.
    """

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self._pending = b""
        self.usage: dict | None = None

    def feed(self, chunk: bytes) -> bytes:
        if not self.strip_usage and b'"usage"' not in chunk and not self._pending:
            return chunk
        data = self._pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b""
        self._pending = data[end + 2 :]
        return self._filter(data[: end + 2])

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._filter(rest) if rest else b""

    def _filter(self, block: bytes) -> bytes:
        if b'"usage"' not in block:
            return block
        kept = []
        for event in block.split(b"\n\n"):
            if b'"usage"' in event and event.startswith(b"data: {"):
                try:
                    payload = fastjson.loads(event[6:])
                except ValueError:
                    kept.append(event)
                    continue
                if isinstance(payload, dict) and payload.get("usage"):
                    self.usage = payload["usage"]
                    if self.strip_usage and not payload.get("choices"):
                        continue
            kept.append(event)
        return b"\n\n".join(kept)
