"""Relaying one request to a worker and its answer back, with retries only before the first byte.

A connect error, a 5xx, a worker that does not hold the model, or an answer
that ends before its first byte moves the request to the next worker. Once a
byte has gone to the client nothing is replayed: a failure mid-stream ends the
stream with an error event. When no worker can serve, the client gets 503 with
``Retry-After``, never a 502.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse

from opod.contract.nodeapi import WORKER_ERROR_HEADER
from opod.fleet import router
from opod.fleet.affinity import AffinityTable
from opod.fleet.local import LocalEngines
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.router import RouteRequest, RoutingPolicy
from opod.fleet.state import Fleet, NodeState
from opod.gateway.outcome import Outcome, RelayObserver
from opod.gateway.sse import relay_sse
from opod.http import fastjson
from opod.http.errors import NoCapacity
from opod.http.fastpath import PreparedResponse
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.http.upstream import UpstreamResponse, origin, split_url
from opod.snapshots.policy import Fallback

MAX_ATTEMPTS = 3
MODEL_HEADER = "X-Opod-Model"
WORKER_HEADER = "X-Opod-Worker"
ROUTE_HEADER = "X-Opod-Route"
TIMING_HEADER = "Server-Timing"
"""``opod;dur=<ms>, upstream;dur=<ms>``: where an answer's time went before its headers left.

``upstream`` is the answering worker's time, from sending it the request to its whole answer
(to its first byte when streamed); ``opod`` is the rest, from the request's arrival: reading,
checking, queueing for a slot, routing, failed attempts, and recording the answer."""
_REQUEST_ID, _WORKER, _ROUTE, _TIMING = (name.lower().encode() for name in ("X-Request-Id", WORKER_HEADER, ROUTE_HEADER, TIMING_HEADER))
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


class Relay:
    def __init__(self, fleet: Fleet, workers: WorkerClient, *, index: PrefixIndex, pins: AffinityTable,
                 local: LocalEngines) -> None:
        self.fleet = fleet
        self.workers = workers
        self.index = index
        self.pins = pins
        self.local = local
        """Workers in this process: their engines are called directly, saving a hop."""

    async def forward(self, call: RelayCall, route: RouteRequest, policy: RoutingPolicy = RoutingPolicy()) -> Response:
        """Relay to the best worker, trying the next one on a failure before the first byte."""
        model = route.model
        tried: list[str] = []
        problems: list[str] = []
        for _ in range(MAX_ATTEMPTS):
            decision = router.pick(self.fleet, route, policy, self.index, self.pins, exclude=tried)
            if decision is None:
                break
            node = decision.node
            tried.append(node.id)
            record = decision.record()
            call.observer.decided(record)
            answer = await self._attempt(node, call, model, route_header(record), problems)
            if answer is not None:
                if policy.prefix_affinity and not decision.blocks and (key := route.pin()):
                    self.pins.pin(key, node.id)  # the index does not place this prefix (yet): the pin does
                if decision.blocks:
                    self.index.touch(node.id, route.hashes[: decision.blocks])
                return answer
        if not tried:
            raise NoCapacity(f"No worker is serving {model!r} right now; it may still be loading. Retry shortly.")
        raise NoCapacity(f"No worker could serve {model!r}: {'; '.join(problems)}. Retry shortly.")

    def _where(self, node: NodeState, model: str, request_id: str, path: str) -> tuple[str, dict[str, str]] | None:
        """The URL to send to and its headers: the engine itself when it is on this machine, else its worker.

        ``None`` when the worker is in this process and serves no engine for ``model``.
        """
        engine = self.local.url(node.id, model)
        if engine is None:
            if node.id in self.local:
                return None
            engine = node.engine_urls.get(model) if node.same_host else None
        if engine is not None:
            # The engine is on this machine: call it on loopback, one hop less than through its worker.
            return engine, {"X-Request-Id": request_id, "Content-Type": "application/json"}
        headers = self.workers.signed_headers(node, "POST", path)
        headers.update({MODEL_HEADER: model, "X-Request-Id": request_id, "Content-Type": "application/json"})
        return node.base_url(), headers

    async def _attempt(self, node: NodeState, call: RelayCall, model: str, route: str, problems: list[str]) -> Response | None:
        observer = call.observer
        request_id = observer.request_id
        lease = self.fleet.lease(node)
        handed_over = False
        resp: UpstreamResponse | None = None
        try:
            where = self._where(node, model, request_id, call.path)
            if where is None:
                problems.append(f"{node.id}: model_not_loaded")
                return None
            url, headers = where
            sent = time.perf_counter()
            resp = await self.workers.upstream.post(origin(url), call.path, call.body, headers, observer.sent)
            if resp.status >= 500 or WORKER_ERROR_HEADER in resp.headers:
                reason = resp.headers.get(WORKER_ERROR_HEADER) or f"HTTP {resp.status}"
                detail = (await resp.text())[:200].strip()
                problems.append(f"{node.id}: {reason}" + (f" ({detail})" if detail else ""))
                self.fleet.failed(node)
                return None
            if not call.stream or resp.status != 200:
                data = resp.read_now()
                if data is None:
                    data = await resp.read()
                answered = time.perf_counter()
                self.fleet.succeeded(node)
                observer.done(Outcome(resp.status, "ok" if resp.status < 400 else "error", node.id, _usage_of(data)))
                return PreparedResponse(data, resp.status, [
                    (_REQUEST_ID, request_id.encode("latin-1")),
                    (_WORKER, node.id.encode("latin-1")),
                    (_ROUTE, route.encode("latin-1")),
                    (_TIMING, server_timing(observer.started, sent, answered).encode("latin-1")),
                    (b"content-type", (resp.content_type or "application/json").encode("latin-1")),
                ])
            try:
                first = await asyncio.wait_for(resp.readany(), FIRST_BYTE_TIMEOUT)
                why = "the answer ended before its first byte"
            except TimeoutError:
                first, why = b"", f"no first byte within {FIRST_BYTE_TIMEOUT:.0f}s"
            if not first:
                problems.append(f"{node.id}: {why}")
                self.fleet.failed(node)
                return None
            answered = time.perf_counter()
            self.fleet.succeeded(node)
            handed_over = True
            ttft_ms = int((answered - observer.started) * 1000)
            headers = {"X-Request-Id": request_id, WORKER_HEADER: node.id, ROUTE_HEADER: route,
                       TIMING_HEADER: server_timing(observer.started, sent, answered), "Cache-Control": "no-cache"}
            return StreamingResponse(relay_sse(resp, first, call.strip_usage, observer.done, ttft_ms, node_id=node.id, lease=lease),
                                     media_type="text/event-stream", headers=headers)
        except (WorkerUnavailable, TimeoutError, OSError) as err:
            problems.append(f"{node.id}: {err or type(err).__name__}")
            self.fleet.failed(node)
            return None
        finally:
            if not handed_over:
                lease.release()
                if resp is not None:
                    resp.release()

    async def external(self, target: Fallback, call: RelayCall, payload: dict) -> Response:
        """Send the request to the policy's fallback (an OpenAI-compatible base URL such as https://host/v1)."""
        observer = call.observer
        body = json.dumps({**payload, "model": target.model or payload.get("model")}).encode()
        headers = {"Content-Type": "application/json", "X-Request-Id": observer.request_id}
        if target.key:
            headers["Authorization"] = f"Bearer {target.key}"
        sent = time.perf_counter()
        try:
            where, target_path = split_url(target.url.rstrip("/") + call.path.removeprefix("/v1"))
            resp = await self.workers.upstream.post(where, target_path, body, headers, observer.sent)
        except OSError as err:
            raise NoCapacity(f"No worker could serve the request and the fallback at {target.url} did not answer ({err}). Retry shortly.") from None
        if resp.status >= 500:
            detail = (await resp.text())[:200]
            resp.release()
            raise NoCapacity(f"No worker could serve the request and the fallback answered HTTP {resp.status} ({detail}). Retry shortly.")
        out_headers = {"X-Request-Id": observer.request_id, ROUTE_HEADER: f"fallback={target.url}"}
        if not call.stream or resp.status != 200:
            data = await resp.read()
            answered = time.perf_counter()
            resp.release()
            observer.done(Outcome(resp.status, "ok" if resp.status < 400 else "error", "", _usage_of(data)))
            out_headers[TIMING_HEADER] = server_timing(observer.started, sent, answered)
            return Response(data, status_code=resp.status, headers=out_headers, media_type=resp.content_type or "application/json")
        first = await resp.readany()
        answered = time.perf_counter()
        ttft_ms = int((answered - observer.started) * 1000)
        out_headers[TIMING_HEADER] = server_timing(observer.started, sent, answered)
        return StreamingResponse(relay_sse(resp, first, call.strip_usage, observer.done, ttft_ms, source=target.url),
                                 media_type="text/event-stream", headers={**out_headers, "Cache-Control": "no-cache"})


def route_header(record: dict) -> str:
    """The ``X-Opod-Route`` value: a routing record as ``key=value`` pairs."""
    return "; ".join([f"{k}={v}" for k, v in record.items()])


def server_timing(started: float, sent: float, answered: float) -> str:
    """The ``Server-Timing`` value for an answer whose last attempt was sent at ``sent`` and answered at ``answered``."""
    upstream = answered - sent
    return f"opod;dur={(time.perf_counter() - started - upstream) * 1000:.3f}, upstream;dur={upstream * 1000:.3f}"


def _usage_of(data: bytes) -> dict | None:
    if b'"usage"' not in data:
        return None
    try:
        usage = fastjson.loads(data).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None
