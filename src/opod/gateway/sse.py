"""A streamed answer passed on to the client as it comes: the usage chunk read (and dropped when the
client did not ask for it), the outcome reported once, and an error event when the upstream breaks off.

Also the other way round: a text completion of several prompts asked whole is relayed as a stream
and put together here (:func:`assemble_completion`), because llama-server's whole answer to a list
of prompts states the usage of its first prompt only, where its stream states each prompt's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from opod.gateway.outcome import Outcome, RelayObserver
from opod.http import fastjson
from opod.http.upstream import UpstreamError, UpstreamResponse

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
) -> AsyncIterator[bytes]:
    """An upstream's SSE answer, passed on as it comes; its outcome is told to ``observer`` once.

    The upstream is worker ``node_id`` (held until the stream ends: ``observer.ended`` lets it go), or the fallback
    URL ``source``.
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
            observer.ended(Outcome(status, outcome, node_id, scanner.usage, ttft_ms, sent))

    try:
        chunk: bytes | None = first
        while chunk is not None:
            out = scanner.feed(chunk)
            if out:
                sent += tokens_in(out)
                if out.find(b"data: [DONE]") >= 0:
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
        resp.release()


def tokens_in(events: bytes) -> int:
    """The tokens a piece of a stream carries: one non-empty content, reasoning or text delta is one token
    on llama-server, vLLM, SGLang and the simulator, which is what a row records as completion tokens
    when the stream ends before its usage."""
    # Called for every piece of every stream, which as a rule carries one kind of delta and few empty ones:
    # what is not there is not counted.
    tokens = 0
    for delta, empty in _DELTAS:
        found = events.count(delta)
        if found:
            tokens += found - events.count(empty)
    return tokens


_DELTAS = tuple((b'"%s":"' % kind, b'"%s":""' % kind) for kind in (b"content", b"reasoning_content", b"text"))
"""Each kind of delta that is a token, and the same kind empty."""


def interrupted_event(node_id: str, err: BaseException) -> bytes:
    error = {
        "message": f"The answer was cut off: the engine on worker {node_id} stopped mid-stream ({type(err).__name__}). Retry the request.",
        "type": "server_error",
        "code": "upstream_interrupted",
    }
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


_NULL = b"data: null"
"""llama-server's empty event. A stream's pieces are looked into with ``find`` and ``count``, never ``in``: bytes'
``in`` tries its text as an int first, raising and dropping a TypeError for every piece."""


class SSEFilter:
    """Passes SSE bytes through, dropping the usage-only chunk when the client did not ask for it
    (and ``data: null``, which is no chunk).

    Events are split on blank lines; only events that mention ``"usage"`` are
    parsed, so a long stream costs a byte search per chunk.
    """

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self._pending = b""
        self.tally = UsageTally()

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.tally.usage

    def feed(self, chunk: bytes) -> bytes:
        if (
            not self._pending
            and chunk.find(b'"usage"') < 0
            and chunk.find(_NULL) < 0
            and (not self.strip_usage or chunk.endswith(b"\n\n"))
        ):
            # Nothing to drop or count, and no event cut in two left to hold back for when a usage chunk is dropped.
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
        if b'"usage"' not in block and _NULL not in block:
            return block
        kept = []
        for event in block.split(b"\n\n"):
            if event == _NULL:
                continue  # llama-server's first event of a list of prompts: no client can read it
            if b'"usage"' in event and event.startswith(b"data: {"):
                try:
                    payload = fastjson.loads(event[6:])
                except ValueError:
                    kept.append(event)
                    continue
                if isinstance(payload, dict) and payload.get("usage"):
                    self.tally.add(payload)
                    if self.strip_usage and not payload.get("choices"):
                        continue
            kept.append(event)
        return b"\n\n".join(kept)


class UsageTally:
    """The usage a stream states, whichever way its engine states it.

    vLLM and SGLang send one chunk without choices holding the whole request's usage; llama-server
    states each prompt's usage in that prompt's last chunk (a list of prompts is answered as one
    stream), so those add up. Chunks of one choice that each carry usage (vLLM's continuous usage)
    count the last one.
    """

    __slots__ = ("total", "by_choice")

    def __init__(self) -> None:
        self.total: dict[str, Any] | None = None
        self.by_choice: dict[object, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            return
        choices = chunk.get("choices")
        if not choices:
            self.total = usage
            return
        first = choices[0] if isinstance(choices, list) else None
        self.by_choice[first.get("index", 0) if isinstance(first, dict) else 0] = usage

    @property
    def usage(self) -> dict[str, Any] | None:
        if self.total is not None or not self.by_choice:
            return self.total
        parts = list(self.by_choice.values())
        if len(parts) == 1:
            return parts[0]
        summed: dict[str, Any] = {}
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            values = [p.get(name) for p in parts]
            if all(isinstance(v, int) for v in values):
                summed[name] = sum(values)
        return summed


async def assemble_completion(
    resp: UpstreamResponse, node_id: str, observer: RelayObserver
) -> tuple[bytes, dict[str, Any] | None]:
    """A text completion's stream put together as OpenAI's whole answer (``text_completion``), with its usage.

    A client that leaves meanwhile is reported ``cancelled`` with the tokens generated so far.
    """
    assembler = CompletionAssembler()
    try:
        while chunk := await resp.readany():
            assembler.feed(chunk)
        assembler.feed(b"\n\n")
    except asyncio.CancelledError:  # the client left: the tokens generated so far are spent
        observer.ended(Outcome(499, "cancelled", node_id, None, tokens_sent=assembler.tokens))
        raise
    finally:
        resp.release()
    return assembler.answer(), assembler.tally.usage


class CompletionAssembler:
    """Text completion chunks in, the whole ``text_completion`` answer out: each choice's text joined,
    its logprobs' lists joined, its last finish reason; the usage added up (:class:`UsageTally`)."""

    def __init__(self) -> None:
        self._pending = b""
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.tally = UsageTally()
        self.tokens = 0
        """The text deltas so far: one token each."""

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return
        self._pending = data[end + 2 :]
        block = data[: end + 2]
        self.tokens += tokens_in(block)
        for event in block.split(b"\n\n"):
            if not event.startswith(b"data: {"):
                continue  # [DONE], llama-server's "data: null", comments
            try:
                chunk = fastjson.loads(event[6:])
            except ValueError:
                continue
            if isinstance(chunk, dict):
                self._take(chunk)

    def _take(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            raise UpstreamError(f"the engine broke off its answer: {str(chunk['error'])[:200]}")
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        self.tally.add(chunk)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            kept = self.choices.setdefault(index, {"index": index, "text": "", "logprobs": None, "finish_reason": None})
            text = choice.get("text")
            if isinstance(text, str):
                kept["text"] += text
            if choice.get("finish_reason") is not None:
                kept["finish_reason"] = choice["finish_reason"]
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict):
                if kept["logprobs"] is None:
                    kept["logprobs"] = {k: list(v) if isinstance(v, list) else v for k, v in logprobs.items()}
                else:
                    for name, value in logprobs.items():
                        if isinstance(value, list) and isinstance(kept["logprobs"].get(name), list):
                            kept["logprobs"][name].extend(value)

    def answer(self) -> bytes:
        body = {
            "id": self.head.get("id", ""),
            "object": "text_completion",
            "created": self.head.get("created", int(time.time())),
            "model": self.head.get("model", ""),
            "choices": [self.choices[i] for i in sorted(self.choices, key=lambda i: i if isinstance(i, int) else 0)],
        }
        if "system_fingerprint" in self.head:
            body["system_fingerprint"] = self.head["system_fingerprint"]
        usage = self.tally.usage
        if usage is not None:
            body["usage"] = usage
        return json.dumps(body).encode()
