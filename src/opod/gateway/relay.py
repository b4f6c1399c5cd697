"""Relaying one request to a worker and its answer back, with retries only before the first byte.

A fault is charged to what failed. An engine that answered HTTP with an error of
its own is alive, and its answer is about the request, so it is never counted
against the worker:

* **Faults of the worker** (counted against the model on that worker, see
  ``Fleet.failed``; the request moves to the next worker): no connection, a
  timeout, an answer that ends before its first byte, a refusal of the worker's
  own (``X-Opod-Worker-Error``: the model is not loaded there, its engine is
  unreachable), and 502, 503 and 504 (the engine cannot serve now: loading, or
  gone behind a proxy), 401 and 403 (the engine does not accept opod's call).
* **Busy** (408, 429): moves on, not counted.
* **Refusals of the content** (every other 4xx): the engine read the request and
  said no. The client gets 400 in OpenAI's shape with the engine's words; no
  other worker is tried, since the same model refuses the same input anywhere.
* **An error answer of a live engine** (500, 501 and the other 5xx): as a rule
  an input that always fails (llama-server answers 500 to a body it cannot
  parse, an image to a text model, an input over its batch). The request moves
  on at most once; when another worker serves it, the first one is charged with
  a failure after all, and otherwise the client gets the engine's words as a 400.

Once a byte has gone to the client nothing is replayed: a failure mid-stream
ends the stream with an error event. When no worker can serve, the client gets
503 with ``Retry-After`` saying why (the model's engine crashed and restarts, it
is cooling down, loading, failed to load), never a 502. That answer is in opod's
words only: what the engines and workers said (a log line, an address, a path)
goes to the leader's log under the request's id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from starlette.responses import Response, StreamingResponse

from opod.contract.nodeapi import WORKER_ERROR_HEADER
from opod.fleet.local import LocalEngines
from opod.fleet.router import Router, RouteRequest, RoutingPolicy
from opod.fleet.state import Fleet, NodeState
from opod.gateway.engine_refusal import Refusal, refusal_body
from opod.gateway.outcome import Outcome, RelayObserver
from opod.gateway.sse import assemble_completion, relay_sse
from opod.http import fastjson
from opod.http.errors import LoopDetected, NoCapacity
from opod.http.fastpath import PreparedResponse
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.http.upstream import UpstreamResponse, origin, split_url
from opod.snapshots.policy import Fallback

log = logging.getLogger("opod.gateway")

MAX_ATTEMPTS = 3
MODEL_HEADER = "X-Opod-Model"
WORKER_HEADER = "X-Opod-Worker"
ROUTE_HEADER = "X-Opod-Route"
_REQUEST_ID, _WORKER, _ROUTE = (name.lower().encode() for name in ("X-Request-Id", WORKER_HEADER, ROUTE_HEADER))
_EVENT_STREAM = [(b"cache-control", b"no-cache"), (b"content-type", b"text/event-stream; charset=utf-8")]
"""A relayed stream's last header lines, as Starlette would write them for ``media_type="text/event-stream"``."""
FIRST_BYTE_TIMEOUT = 120.0
"""A stream whose first byte takes longer than this is treated as a failed attempt (a stalled engine)."""


@dataclass(slots=True)
class RelayCall:
    """What is relayed: the body for ``path``, whole or streamed, and who hears how it goes."""

    path: str
    body: bytes
    stream: bool
    strip_usage: bool
    """The usage-only chunk of a stream is dropped: the client did not ask for it."""
    observer: RelayObserver
    assemble: bool = False
    """Asked whole, relayed as a stream (``stream`` is false, the body asks the engine for one), and put
    together as the whole answer (:func:`opod.gateway.sse.assemble_completion`): a list of prompts."""


class Relay:
    def __init__(self, fleet: Fleet, workers: WorkerClient, *, router: Router, local: LocalEngines) -> None:
        self.fleet = fleet
        self.workers = workers
        self.router = router
        self.local = local
        """Workers in this process: their engines are called directly, saving a hop."""

    async def forward(self, call: RelayCall, route: RouteRequest, policy: RoutingPolicy = RoutingPolicy()) -> Response:
        """Relay to the best worker, trying the next one on a failure before the first byte."""
        model = route.model
        tried: list[str] = []
        problems: list[Problem] = []
        suspect: Refusal | None = None
        """A live engine's 5xx answer: moved on from once, and the client's answer if no one does better."""
        for _ in range(MAX_ATTEMPTS):
            decision = self.router.pick(route, policy, exclude=tried)
            if decision is None:
                break
            node = decision.node
            tried.append(node.id)
            record = decision.record()
            call.observer.routed(record)
            # The X-Opod-Route value: the record as "key=value" pairs, each made by the format string's own
            # method (a comprehension would be one more Python call per request).
            route_value = "; ".join(map("%s=%s".__mod__, record.items()))
            answer = await self._attempt(node, call, model, route_value, problems)
            if isinstance(answer, Refusal):
                if answer.final or suspect is not None:
                    return self._refused(answer, call)
                suspect = answer
                continue
            if answer is not None:
                if suspect is not None:  # the same request was served here: that engine's error was its own
                    self.fleet.failed(suspect.node, model, f"HTTP {suspect.status} ({suspect.message[:120]})")
                self.router.served(decision, route, policy)
                return answer
        if suspect is not None:
            return self._refused(suspect, call)
        availability = self.fleet.availability(model)
        request_id = call.observer.request_id
        if not tried:
            wait = availability.retry_after()
            log.info("%s: %s cannot serve: %s", request_id, model, availability.told_operators())
            raise NoCapacity(
                f"The model {model!r} cannot serve right now: {availability.why()}. Retry in {wait}s.", retry_after=wait
            )
        told = "; ".join(p.told_operators for p in problems)
        tried_words = "; ".join(p.said for p in problems)
        if availability.ok:  # others still serve it: the next try may well land there
            log.warning("%s: no worker could serve %s: %s", request_id, model, told)
            raise NoCapacity(f"No worker could serve {model!r}: {tried_words}. Retry in 1s.", retry_after=1)
        wait = availability.retry_after()
        log.warning(
            "%s: no worker could serve %s: %s; it cannot serve now: %s",
            request_id,
            model,
            told,
            availability.told_operators(),
        )
        raise NoCapacity(
            f"No worker could serve {model!r}: {tried_words}. It cannot serve now: {availability.why()}. "
            f"Retry in {wait}s.",
            retry_after=wait,
        )

    def _refused(self, refusal: Refusal, call: RelayCall) -> Response:
        """The engine's refusal of the request's content, as the client's 400 in OpenAI's shape."""
        observer = call.observer
        body = json.dumps(refusal_body(refusal)).encode()
        observer.answered(refusal.answered - refusal.sent)
        observer.ended(Outcome(400, "error", refusal.node.id, None, engine_failed=not refusal.final))
        return PreparedResponse(
            body,
            400,
            [
                (_REQUEST_ID, observer.request_id.encode("latin-1")),
                (_WORKER, refusal.node.id.encode("latin-1")),
                (_ROUTE, refusal.route.encode("latin-1")),
                (b"content-type", b"application/json"),
            ],
        )

    def _where(
        self, node: NodeState, model: str, request_id: str, request_id_bytes: bytes, path: str
    ) -> tuple[str, Mapping[str, str] | bytes] | None:
        """The URL to send to and its headers: the engine itself when it is on this machine, else its worker.

        ``None`` when the worker is in this process and serves no engine for ``model``.
        """
        engine_url = self.local.workers.get(node.id)
        if engine_url is not None:
            engine = engine_url(model)
            if engine is None:
                return None
        else:
            engine = node.engine_urls.get(model) if node.same_host else None
        if engine is not None:
            # The engine is on this machine: call it on loopback, one hop less than through its worker.
            return engine, b"X-Request-Id: %s\r\nContent-Type: application/json\r\n" % request_id_bytes
        headers = self.workers.signed_headers(node, "POST", path)
        headers.update({MODEL_HEADER: model, "X-Request-Id": request_id, "Content-Type": "application/json"})
        return node.base_url(), headers

    async def _attempt(
        self, node: NodeState, call: RelayCall, model: str, route: str, problems: list[Problem]
    ) -> Response | Refusal | None:
        """The answer; a :class:`Refusal` when the engine refused the request's content; ``None`` to move on."""
        observer = call.observer
        request_id = observer.request_id
        # Encoded once: it goes into the call's headers and the answer's.
        request_id_bytes = request_id.encode("latin-1")
        observer.leased(self.fleet.lease(node, model))
        # The answer's connection is no longer this attempt's to release: back with the pool (its body read whole)
        # or handed to the stream.
        let_go = False
        resp: UpstreamResponse | None = None
        try:
            where = self._where(node, model, request_id, request_id_bytes, call.path)
            if where is None:
                problems.append(Problem(node.id, "model_not_loaded"))
                return None
            url, headers = where
            sent = time.perf_counter()
            resp = await self.workers.upstream.post(origin(url), call.path, call.body, headers, observer.sent)
            status = resp.status
            if status >= 400:
                kind = answer_kind(status, WORKER_ERROR_HEADER in resp.headers)
                data = resp.read_now()
                if data is None:
                    data = await resp.read()
                if kind in (REFUSED, ENGINE_ERROR):
                    return Refusal.of(
                        node, status, data, final=kind == REFUSED, route=route, sent=sent, answered=time.perf_counter()
                    )
                code = resp.headers.get(WORKER_ERROR_HEADER, "")
                reason = code if code.isidentifier() else f"HTTP {status}"  # the worker's codes: model_not_loaded, ...
                detail = data[:200].decode(errors="replace").strip()
                problem = Problem(node.id, reason, detail)
                problems.append(problem)
                if kind == FAULT:
                    self.fleet.failed(node, model, problem.detailed)
                return None
            if not call.stream or resp.status != 200:
                parsed = None
                if call.assemble and resp.status == 200:
                    data, usage = await assemble_completion(resp, node.id, observer)
                else:
                    data = resp.read_now()
                    if data is None:
                        data = await resp.read()
                    parsed, usage = _usage_of(data)
                let_go = True  # reading it whole gave the connection back
                observer.answered(time.perf_counter() - sent)
                self.fleet.succeeded(node, model)
                observer.ended(Outcome(resp.status, "ok", node.id, usage))
                answer = RelayedAnswer(
                    data,
                    resp.status,
                    [
                        (_REQUEST_ID, request_id_bytes),
                        (_WORKER, node.id.encode("latin-1")),
                        (_ROUTE, route.encode("latin-1")),
                        (
                            b"content-type",
                            b"application/json" if call.assemble else _media_type(resp.content_type),
                        ),
                    ],
                )
                answer.parsed = parsed
                return answer
            try:
                async with asyncio.timeout(FIRST_BYTE_TIMEOUT):  # a timer on this task: no task of its own
                    first = await resp.readany()
                why = "the answer ended before its first byte"
            except TimeoutError:
                first, why = b"", f"no first byte within {FIRST_BYTE_TIMEOUT:.0f}s"
            if not first:
                problems.append(Problem(node.id, why))
                self.fleet.failed(node, model, why)
                return None
            answered = time.perf_counter()
            observer.answered(answered - sent)
            self.fleet.succeeded(node, model)
            let_go = True
            ttft_ms = int((answered - observer.started) * 1000)
            stream = StreamingResponse(relay_sse(resp, first, call.strip_usage, observer, ttft_ms, node_id=node.id))
            # The header lines made here as bytes: Starlette would encode each name and value again.
            stream.raw_headers = [
                (_REQUEST_ID, request_id_bytes),
                (_WORKER, node.id.encode("latin-1")),
                (_ROUTE, route.encode("latin-1")),
                *_EVENT_STREAM,
            ]
            return stream
        except (WorkerUnavailable, TimeoutError, OSError) as err:
            said = "timed out" if isinstance(err, TimeoutError) else "connection failed"
            problem = Problem(node.id, said, str(err) or type(err).__name__)
            problems.append(problem)
            self.fleet.failed(node, model, problem.detail)
            return None
        finally:
            if not let_go and resp is not None:
                resp.release()

    async def external(
        self, target: Fallback, call: RelayCall, payload: dict[str, Any], extra: Mapping[str, str] | None = None
    ) -> Response:
        """Send the request to an OpenAI-compatible base URL such as https://host/v1 (the policy's fallback, a
        federation peer), with ``extra`` headers. A 508 (the request came round a loop of clusters) is answered as
        it is; another 5xx, or no answer, is :class:`NoCapacity`."""
        observer = call.observer
        # The body as the guardrails left it, the model named as the target names it.
        sent_body = json.loads(call.body) if target.model else payload
        body = json.dumps({**sent_body, "model": target.model or payload.get("model")}).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": observer.request_id, **(extra or {})}
        if target.key:
            headers["Authorization"] = f"Bearer {target.key}"
        sent = time.perf_counter()
        try:
            where, target_path = split_url(target.url.rstrip("/") + call.path.removeprefix("/v1"))
            resp = await self.workers.upstream.post(where, target_path, body, headers, observer.sent)
        except OSError as err:
            log.warning("%s: the fallback at %s did not answer: %s", observer.request_id, target.url, err)
            raise NoCapacity(
                "No worker could serve the request and the fallback did not answer. Retry shortly."
            ) from None
        if resp.status >= 500 and resp.status != LoopDetected.status:
            detail = (await resp.text())[:200]
            resp.release()
            log.warning(
                "%s: the fallback at %s answered HTTP %s: %s", observer.request_id, target.url, resp.status, detail
            )
            raise NoCapacity(
                f"No worker could serve the request and the fallback answered HTTP {resp.status}. Retry shortly."
            )
        out_headers = {"X-Request-Id": observer.request_id, ROUTE_HEADER: f"fallback={target.url}"}
        if not call.stream or resp.status != 200:
            if call.assemble and resp.status == 200:
                data, usage = await assemble_completion(resp, "", observer)
            else:
                data = await resp.read()
                _, usage = _usage_of(data)
            observer.answered(time.perf_counter() - sent)
            resp.release()
            observer.ended(Outcome(resp.status, "ok" if resp.status < 400 else "error", "", usage))
            media = "application/json" if call.assemble else resp.content_type or "application/json"
            return Response(data, status_code=resp.status, headers=out_headers, media_type=media)
        first = await resp.readany()
        answered = time.perf_counter()
        observer.answered(answered - sent)
        ttft_ms = int((answered - observer.started) * 1000)
        return StreamingResponse(
            relay_sse(resp, first, call.strip_usage, observer, ttft_ms, source=target.url),
            media_type="text/event-stream",
            headers={**out_headers, "Cache-Control": "no-cache"},
        )


@dataclass(frozen=True, slots=True)
class Problem:
    """A failed attempt: what the client is told (``said``, opod's words) and what only the log gets (``detail``:
    an engine's answer, an address)."""

    node_id: str
    reason: str
    detail: str = ""

    @property
    def said(self) -> str:
        return f"{self.node_id}: {self.reason}"

    @property
    def detailed(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason

    @property
    def told_operators(self) -> str:
        return f"{self.node_id}: {self.detailed}"


FAULT, BUSY, REFUSED, ENGINE_ERROR = "fault", "busy", "refused", "engine_error"


def answer_kind(status: int, worker_error: bool) -> str:
    """Which of the module docstring's kinds an error answer (status ≥ 400) is."""
    if worker_error or status in (401, 403, 502, 503, 504):
        return FAULT
    if status in (408, 429):
        return BUSY
    return REFUSED if status < 500 else ENGINE_ERROR


@lru_cache(maxsize=64)
def _media_type(media_type: str) -> bytes:
    """An engine's media type (``UpstreamResponse.content_type``) as the answer's, ``application/json`` when it names
    none.

    Kept per value: engines send one or two values, on every answer."""
    return (media_type or "application/json").encode("latin-1")


def _usage_of(data: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A whole answer's JSON object when it names its usage (the answers worth parsing here), and that usage;
    ``None`` for what is not there."""
    # find, not ``in``: bytes' ``in`` tries its text as an int first, raising and dropping a TypeError each time.
    if data.find(b'"usage"') < 0:
        return None, None
    try:
        parsed = fastjson.loads(data)
    except ValueError:
        return None, None
    if not isinstance(parsed, dict):
        return None, None
    usage = parsed.get("usage")
    return parsed, usage if isinstance(usage, dict) else None


class RelayedAnswer(PreparedResponse):
    """An engine's whole answer, with its JSON object as parsed for its usage (``None`` where it was not): the
    guard policies' output checks read that instead of parsing the answer again."""

    # Set by the relay once made: an ``__init__`` of this class's own would be one more call per answer.
    parsed: dict[str, Any] | None = None
