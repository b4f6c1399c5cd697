"""``/api/v1/requests/{id}``: one ``/v1`` request's record, its kept body, and its replay.

The record is the request's usage row (the newest, where a client reused an ``X-Request-Id``):
who made it, the model asked and the one that answered, the replica, status, latencies, queue
time, tokens, cost, cache hit, end user and tags, and what the guardrails did: ``guard_action``
(``block``, ``unavailable`` (a guardrail failed closed), ``rewrite``, ``failed_open``, ``flag`` or
``allow``: the strongest action a ``pre`` or ``post`` guardrail or a guard policy took), ``guard_policy``
(that guardrail's id in the policy file, or the guard policy's name), ``guard_rule`` (the phase a
guardrail acted in, ``pre`` or ``post``; the check that decided for a guard policy),
``guard_category`` (the reason it gave, or what went wrong with it) and ``guard_ms`` (the time
spent in guardrail webhooks); all absent when no guardrail was consulted. Its body is there only where the retention
settings kept it; a 404 says why not (bodies off, the project's own setting, ``store: false``,
expired). A replay sends the kept request again, through the gateway's own path (rules,
admission, routing, a usage row of its own) as the operator's own request, under the admin key
(never charged to the project it repeats), and always unstreamed, so its answer is one JSON body.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from fastapi import APIRouter

from opod.contract.admin.records import ReplayRequest, ReplayView, RequestView, StoreRequestBody
from opod.control.context import ControlError, Replayer
from opod.control.spec import SpecRouter
from opod.store import NotFound, Store
from opod.store.offloop import run_sync
from opod.store.requests import RequestBody
from opod.store.usage import UsageRecord

Replay = Callable[[str, str, bytes, str], Awaitable[tuple[int, bytes]]]
"""(original key id, path, body, new request id) → the status and body a client would get."""

WHY_NOT_KEPT = {
    "off": "the cluster's settings keep no bodies (retention.bodies is false); turn it on with PUT /api/v1/settings "
    "to keep the bodies of later requests",
    "project_off": "its project's retention entry keeps no bodies (retention.projects.<project>.bodies is false)",
    "no_store": 'the request said "store": false',
    "kept": "it was kept, and has expired (retention.bodies_days) or was dropped while the store was behind",
    "dropped": "the store was behind when it came, and it was dropped",
}


def request_view(row: UsageRecord) -> RequestView:
    tags = None
    if row.tags_json:
        try:
            parsed = json.loads(row.tags_json)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            tags = {str(k): str(v) for k, v in parsed.items()}
    return RequestView(
        request_id=row.request_id,
        at=row.ts,
        key_id=row.api_key_id or None,
        user_id=row.user_id or None,
        project_id=row.project_id or None,
        model=row.model or None,
        served_model=row.served_model or row.model or None,
        replica=row.node_id or None,
        status=row.status or None,
        latency_ms=row.latency_ms,
        queue_ms=row.queue_ms,
        ttft_ms=row.ttft_ms,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        cost_micros=row.cost_micros,
        end_user=row.end_user or None,
        tags=tags,
        cache_hit=row.cache_hit,
        guard_action=row.guard_action or None,
        guard_policy=row.guard_policy or None,
        guard_rule=row.guard_rule or None,
        guard_category=row.guard_category or None,
        guard_ms=row.guard_ms if row.guard_action else None,
    )


def body_view(body: RequestBody) -> StoreRequestBody:
    return StoreRequestBody(
        request_id=body.request_id,
        project_id=body.project_id or None,
        at=body.at,
        expires_at=body.expires_at,
        path=body.path,
        model=body.model or None,
        served_model=body.served_model or None,
        status=body.status,
        request=body.request,
        response=body.response,
        truncated=body.truncated,
    )


def kept_body(store: Store, request_id: str) -> RequestBody:
    """The body kept of ``request_id``; a 404 saying why there is none."""
    try:
        body = store.get_request_body(request_id)
    except NotFound:
        body = None
    if body is not None:
        if body.expires_at <= datetime.now(UTC):
            raise ControlError(
                404,
                f"the body of request {request_id!r} expired at {body.expires_at:%Y-%m-%d %H:%M} UTC "
                "(retention.bodies_days); it is no longer kept",
            )
        return body
    record = store.find_request(request_id)  # NotFound → 404 naming the id
    why = WHY_NOT_KEPT.get(
        record.body_state, "it was refused before it was relayed, or made before bodies were recorded"
    )
    raise ControlError(404, f"no body is kept for request {request_id!r}: {why}")


def replay_body(body: RequestBody, model: str) -> bytes:
    """The kept request, to ``model``, unstreamed; a 409 when what was kept cannot be sent again."""
    if body.truncated:
        raise ControlError(
            409,
            f"request {body.request_id!r} was kept truncated (retention.body_max_bytes); "
            "a cut request cannot be replayed",
        )
    try:
        payload = json.loads(body.request)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise ControlError(
            409, f"the body kept of request {body.request_id!r} is not a JSON object; it cannot be replayed"
        )
    payload["model"] = model
    payload.pop("stream_options", None)
    payload["stream"] = False
    return json.dumps(payload).encode()


def router(store: Store, replay: Replayer) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/requests/{id}", operation_id="getRequestsId", tags=["requests"], response_model=RequestView)
    async def get_requests_id(id: str) -> RequestView:
        return request_view(await run_sync(store.find_request, id))

    @api.get(
        "/api/v1/requests/{id}/body",
        operation_id="getRequestsIdBody",
        tags=["requests"],
        response_model=StoreRequestBody,
    )
    async def get_requests_id_body(id: str) -> StoreRequestBody:
        return body_view(await run_sync(kept_body, store, id))

    @api.post(
        "/api/v1/requests/{id}/replay",
        operation_id="postRequestsIdReplay",
        tags=["requests"],
        response_model=ReplayView,
    )
    async def post_requests_id_replay(id: str, body: ReplayRequest) -> ReplayView:
        kept = await run_sync(kept_body, store, id)
        model = (body.model or "").strip() or kept.model
        if not model:
            raise ControlError(400, 'model: the kept request names no model; name one in the body ({"model": "..."})')
        payload = replay_body(kept, model)
        started = time.perf_counter()
        status, answer = await replay.replay(kept.path, payload, f"replay-{secrets.token_hex(8)}")
        took_ms = int((time.perf_counter() - started) * 1000)
        try:
            parsed: object = json.loads(answer) if answer else None
        except ValueError:
            parsed = answer.decode("utf-8", "replace")
        return ReplayView(original=body_view(kept), model=model, status=status, body=parsed, took_ms=took_ms)

    return api
