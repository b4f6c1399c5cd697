"""Guardrail webhooks from the policy file: ``pre`` (before the engine), ``post`` (after a non-streamed answer), ``logging_only``.

The webhook wire (opod's design; the contract names the rules, not the exchange):

Request: ``POST <rule.url>`` with ``Content-Type: application/json``,
``X-Request-Id: <request id>``, ``X-Opod-Guardrail: <rule.id>``,
``Authorization: Bearer <rule.authKey>`` when the rule has one, and the rule's
``headers``. Body::

    {"phase": "pre" | "post" | "logging_only",
     "guardrail_id": "pii",
     "request_id": "req_…",
     "model": "smollm2-135m-instruct",
     "request": {…},        # the request body as the engine would get it (after earlier rewrites)
     "response": {…}|null,  # post: the answer; logging_only: the answer when it was not streamed
     "status": 200|null}    # logging_only: the answer's HTTP status, when known

Answer: a 2xx status with a JSON body::

    {"action": "allow"}                                   # go on (an empty body or 204 means the same)
    {"action": "block", "reason": "contains a card number"}
    {"action": "rewrite", "body": {…}, "reason": "…"}     # pre: the new request; post: the new answer

Anything else (no connection, no answer within ``timeoutMs`` (default 2000),
a non-2xx status, a body that is not such JSON, a rewrite that is not an object
or changes the model) is a failure of the webhook: with ``failOpen`` the
request goes on as if the webhook said allow; without it the client gets 503
``guardrail_unavailable`` naming the guardrail. A block is 400
``guardrail_blocked`` naming the guardrail and its reason. Rules of a phase run
one after another in the file's order, each seeing the previous rewrite.
``logging_only`` webhooks are called in the background; their answers and
failures never touch the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp

from opod.contract.adminapi import GuardrailRule, PolicySnapshot
from opod.http.errors import GatewayError
from opod.snapshots.policy import PolicyView

log = logging.getLogger("opod.guardrails")

DEFAULT_TIMEOUT_MS = 2000
MAX_PENDING_LOGS = 1000
"""``logging_only`` calls in flight at most; beyond it new ones are dropped (and counted), never queued."""
MAX_ANSWER_BYTES = 32 << 20


class GuardrailBlocked(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "guardrail_blocked"

    def __init__(self, rule_id: str, phase: str, reason: str) -> None:
        what = "request" if phase == "pre" else "answer"
        why = f": {reason}" if reason else ""
        super().__init__(f"Guardrail {rule_id!r} blocked the {what}{why}.")
        self.rule_id = rule_id


class GuardrailUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "guardrail_unavailable"

    def __init__(self, rule_id: str, problem: str) -> None:
        super().__init__(
            f"Guardrail {rule_id!r} could not be consulted ({problem}) and it fails closed, so the request was "
            f"refused. Retry shortly; if it persists, the operator should check the webhook or set failOpen.",
            headers={"Retry-After": "5"},
        )
        self.rule_id = rule_id


class _WebhookFailed(Exception):
    """The webhook did not give a usable answer; the message says what happened."""


Rules = PolicySnapshot | PolicyView | Sequence[GuardrailRule] | None
"""What the phases accept: the policy as held, its view, or the rules themselves."""


def _rules(policy: Rules, phase: str) -> list[GuardrailRule]:
    if policy is None:
        return []
    rules = policy.guardrails if isinstance(policy, PolicySnapshot | PolicyView) else policy
    return [r for r in rules or () if r.phase == phase]


def _json_or_text(body: bytes | None) -> Any:
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")


class Guardrails:
    """Calls the policy's guardrail webhooks. One per leader; :meth:`close` at shutdown."""

    def __init__(self, session: aiohttp.ClientSession | None = None) -> None:
        self._session = session
        self._own_session = session is None
        self._pending: set[asyncio.Task[None]] = set()
        self.dropped_logs = 0
        """``logging_only`` calls dropped because too many were in flight."""

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
            self._own_session = True
        return self._session

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._own_session and self._session is not None:
            await self._session.close()

    # --- the three phases ----------------------------------------------------------------

    async def pre(self, policy: Rules, request_id: str, model: str, body: bytes) -> bytes:
        """The request body to send on (``body`` itself when nothing rewrote it); raises a refusal otherwise."""
        rules = _rules(policy, "pre")
        if not rules:
            return body
        request = _json_or_text(body)
        rewritten = False
        for rule in rules:
            payload = {"phase": "pre", "guardrail_id": rule.id, "request_id": request_id, "model": model,
                       "request": request, "response": None}
            new = await self._judge(rule, payload, request_id)
            if new is not None:
                # The model stays the one the gateway resolved (a rewrite may leave it out).
                request, rewritten = {**new, "model": model}, True
        return json.dumps(request).encode() if rewritten else body

    async def post(self, policy: Rules, request_id: str, model: str, request_body: bytes, answer: bytes) -> bytes:
        """The answer to give the client (``answer`` itself when nothing rewrote it); raises a refusal otherwise.

        Only for answers that were not streamed: a stream has gone to the client before it could be judged.
        """
        rules = _rules(policy, "post")
        if not rules:
            return answer
        request = _json_or_text(request_body)
        response = _json_or_text(answer)
        rewritten = False
        for rule in rules:
            payload = {"phase": "post", "guardrail_id": rule.id, "request_id": request_id, "model": model,
                       "request": request, "response": response}
            new = await self._judge(rule, payload, request_id)
            if new is not None:
                response, rewritten = new, True
        return json.dumps(response).encode() if rewritten else answer

    def log(self, policy: Rules, request_id: str, model: str, request_body: bytes,
            answer: bytes | None = None, status: int | None = None) -> None:
        """Send the exchange to every ``logging_only`` webhook in the background; returns at once."""
        rules = _rules(policy, "logging_only")
        if not rules:
            return
        payload = {"phase": "logging_only", "guardrail_id": "", "request_id": request_id, "model": model,
                   "request": _json_or_text(request_body), "response": _json_or_text(answer), "status": status}
        for rule in rules:
            if len(self._pending) >= MAX_PENDING_LOGS:
                self.dropped_logs += 1
                continue
            task = asyncio.get_running_loop().create_task(self._log_one(rule, {**payload, "guardrail_id": rule.id}, request_id))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _log_one(self, rule: GuardrailRule, payload: dict[str, Any], request_id: str) -> None:
        try:
            await self._call(rule, payload, request_id)
        except _WebhookFailed as err:
            log.warning("logging guardrail %r: %s", rule.id, err)

    # --- one webhook ------------------------------------------------------------------------

    async def _judge(self, rule: GuardrailRule, payload: dict[str, Any], request_id: str) -> Any | None:
        """None to go on unchanged, a new body for a rewrite; raises a refusal for a block or a closed failure."""
        try:
            answer = await self._call(rule, payload, request_id)
            if not answer:
                return None
            action = answer.get("action", "allow")
            if action == "allow":
                return None
            if action == "block":
                reason = answer.get("reason")
                raise GuardrailBlocked(rule.id, rule.phase, reason if isinstance(reason, str) else "")
            if action == "rewrite":
                body = answer.get("body")
                if not isinstance(body, dict):
                    raise _WebhookFailed("it answered rewrite without a JSON object in body")
                if rule.phase == "pre" and body.get("model", payload["model"]) != payload["model"]:
                    raise _WebhookFailed(f"its rewrite changed the model to {body.get('model')!r}")
                return body
            raise _WebhookFailed(f"it answered an unknown action {action!r} (allow, block or rewrite)")
        except _WebhookFailed as err:
            if rule.fail_open:
                log.warning("guardrail %r failed open for %s: %s", rule.id, request_id, err)
                return None
            raise GuardrailUnavailable(rule.id, str(err)) from None

    async def _call(self, rule: GuardrailRule, payload: dict[str, Any], request_id: str) -> dict[str, Any] | None:
        timeout_ms = rule.timeout_ms or DEFAULT_TIMEOUT_MS
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id, "X-Opod-Guardrail": rule.id}
        if rule.auth_key:
            headers["Authorization"] = f"Bearer {rule.auth_key}"
        headers.update(rule.headers or {})
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                async with self.session.post(rule.url, data=json.dumps(payload).encode(), headers=headers) as resp:
                    data = await resp.content.read(MAX_ANSWER_BYTES)
                    status = resp.status
        except TimeoutError:
            raise _WebhookFailed(f"no answer within {timeout_ms} ms") from None
        except (aiohttp.ClientError, OSError) as err:
            raise _WebhookFailed(f"cannot reach {rule.url}: {err or type(err).__name__}") from None
        if not 200 <= status < 300:
            raise _WebhookFailed(f"it answered HTTP {status}")
        if not data.strip():
            return None
        try:
            answer = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise _WebhookFailed("its answer is not JSON") from None
        if not isinstance(answer, dict):
            raise _WebhookFailed("its answer is not a JSON object")
        return answer

