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

What the guardrails did goes into the request's record (``GET /api/v1/requests/{id}``)
through a :class:`GuardNote` the gateway hands to :meth:`Guardrails.pre` and
:meth:`Guardrails.post`. One action decides, the strongest any ``pre`` or ``post``
rule took, the first rule to take it winning a tie:

- ``block``: a rule blocked the request or its answer (the client got 400);
- ``unavailable``: a rule failed and fails closed (the client got 503);
- ``rewrite``: a rule rewrote the request or the answer;
- ``failed_open``: a rule failed and fails open, so the request went on unchecked by it;
- ``allow``: every rule consulted allowed it.

With it: the deciding rule's id (``guard_policy``), its phase, ``pre`` or ``post``
(``guard_rule``: the id already names the rule, the phase says whether the request or the
answer was judged), the reason a block or rewrite gave, or what went wrong with a failed
webhook, cut to :data:`MAX_GUARD_CATEGORY` characters (``guard_category``), and the
milliseconds spent waiting on ``pre`` and ``post`` webhooks (``guard_ms``). A request no
``pre`` or ``post`` rule was consulted for has no note fields at all; ``logging_only`` calls
are never in it (they run after the answer, in the background).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opod.contract.adminapi import GuardrailRule, PolicySnapshot
from opod.http import fastjson
from opod.http.errors import GatewayError
from opod.http.upstream import Origin, UpstreamResponse, Upstreams, header_lines, split_url
from opod.snapshots.policy import PolicyView

log = logging.getLogger("opod.guardrails")

DEFAULT_TIMEOUT_MS = 2000
MAX_PENDING_LOGS = 1000
"""``logging_only`` calls in flight at most; beyond it new ones are dropped (and counted), never queued."""
MAX_ANSWER_BYTES = 32 << 20
MAX_WEBHOOKS = 256
"""Rules whose webhook's address and headers are kept made; past it the table starts afresh."""


GUARD_ACTIONS = ("allow", "failed_open", "rewrite", "unavailable", "block")
"""The actions a :class:`GuardNote` may say, weakest first."""
_RANK = {action: rank for rank, action in enumerate(GUARD_ACTIONS)}
MAX_GUARD_CATEGORY = 200
"""The reason a rule gave, as the request's record keeps it, in characters."""


@dataclass(slots=True)
class GuardNote:
    """What the ``pre`` and ``post`` rules did to one request (see the module's docstring); filled as they run."""

    action: str = ""
    """One of :data:`GUARD_ACTIONS`; '' while no rule has been consulted."""
    policy: str = ""
    rule: str = ""
    category: str = ""
    seconds: float = 0.0
    """Time spent waiting on the webhooks."""

    def saw(self, action: str, rule: GuardrailRule, why: str = "") -> None:
        """``rule`` took ``action``; it decides when it is stronger than what decided so far."""
        if _RANK[action] > _RANK.get(self.action, -1):
            self.action, self.policy, self.rule, self.category = action, rule.id, rule.phase, why[:MAX_GUARD_CATEGORY]

    def fields(self) -> dict[str, object]:
        """The request record's guard fields (``guard_action``, ...); none when no rule was consulted."""
        if not self.action:
            return {}
        out: dict[str, object] = {
            "guard_action": self.action,
            "guard_policy": self.policy,
            "guard_rule": self.rule,
            "guard_ms": int(self.seconds * 1000),
        }
        if self.category:
            out["guard_category"] = self.category
        return out


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


def _envelope(fields: dict[str, Any], **raw: bytes) -> bytes:
    """A webhook's body: ``fields`` as JSON, and each of ``raw`` spliced in as the JSON text it is already."""
    head = fastjson.dumps(fields)[:-1]
    return head + b"".join(b',"%s":%s' % (name.encode(), value) for name, value in raw.items()) + b"}"


def _as_json(body: bytes) -> bytes:
    """``body`` as JSON text for an envelope: itself when it is JSON already (an engine's answer), else as a string."""
    try:
        fastjson.loads(body)
    except ValueError:
        return fastjson.dumps(body.decode("utf-8", "replace"))
    return body


@dataclass(frozen=True, slots=True)
class _Webhook:
    """What every call to one rule's webhook sends alike, made once per rule: where, and the fixed headers."""

    rule: GuardrailRule
    origin: Origin
    target: str
    headers: bytes
    """The header lines, encoded: the rule's own, and ``X-Request-Id`` where the rule does not set it."""
    own_request_id: bool
    """The rule's headers set ``X-Request-Id``: the request's is not added."""

    def header_lines(self, request_id: str) -> bytes:
        if self.own_request_id:
            return self.headers
        return self.headers + b"X-Request-Id: %s\r\n" % request_id.encode("latin-1")


def _webhook(rule: GuardrailRule) -> _Webhook:
    """``rule``'s webhook; ``UpstreamError`` (an OSError) when its URL is not http(s)."""
    headers = {"Content-Type": "application/json", "X-Opod-Guardrail": rule.id}
    if rule.auth_key:
        headers["Authorization"] = f"Bearer {rule.auth_key}"
    headers.update(rule.headers or {})
    where, target = split_url(rule.url)
    own_request_id = any(name.lower() == "x-request-id" for name in headers)
    return _Webhook(rule, where, target, header_lines(headers), own_request_id)


async def _read_capped(resp: UpstreamResponse) -> bytes:
    """A webhook's answer, at most :data:`MAX_ANSWER_BYTES` of it."""
    whole = resp.read_now()
    if whole is not None:
        return whole[:MAX_ANSWER_BYTES]
    parts, size = [], 0
    while size < MAX_ANSWER_BYTES and (chunk := await resp.readany()):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:MAX_ANSWER_BYTES]


def _json_or_text(body: bytes | None) -> Any:
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")


class Guardrails:
    """Calls the policy's guardrail webhooks. One per leader; :meth:`close` at shutdown.

    The calls go over the same kind of keep-alive pool as the relay's (:mod:`opod.http.upstream`): a
    ``pre`` webhook is on every request's way, and a general client costs it more CPU than the relay.
    """

    def __init__(self, upstream: Upstreams | None = None) -> None:
        self.upstream = upstream or Upstreams()
        self._webhooks: dict[int, _Webhook] = {}
        """``id(rule)`` → its webhook; the entry holds the rule, so the id is not another's while it is kept."""
        self._pending: set[asyncio.Task[None]] = set()
        self.dropped_logs = 0
        """``logging_only`` calls dropped because too many were in flight."""

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self.upstream.close()

    # --- the three phases ----------------------------------------------------------------

    async def pre(
        self, policy: Rules, request_id: str, model: str, body: bytes, note: GuardNote | None = None
    ) -> bytes:
        """The request body to send on (``body`` itself when nothing rewrote it); raises a refusal otherwise.

        ``note`` is told what each rule did, a refusal included."""
        rules = _rules(policy, "pre")
        if not rules:
            return body
        for rule in rules:
            # The request is the JSON object the gateway checked: it goes into the call as it is, unparsed.
            fields = {"phase": "pre", "guardrail_id": rule.id, "request_id": request_id, "model": model}
            payload = _envelope(fields, request=body, response=b"null")
            new = await self._judge(rule, payload, model, request_id, note)
            if new is not None:
                # The model stays the one the gateway resolved (a rewrite may leave it out).
                body = json.dumps({**new, "model": model}).encode()
        return body

    async def post(
        self,
        policy: Rules,
        request_id: str,
        model: str,
        request_body: bytes,
        answer: bytes,
        note: GuardNote | None = None,
    ) -> bytes:
        """The answer to give the client (``answer`` itself when nothing rewrote it); raises a refusal otherwise.

        Only for answers that were not streamed: a stream has gone to the client before it could be judged.
        """
        rules = _rules(policy, "post")
        if not rules:
            return answer
        # The request is the JSON the gateway relayed and the answer the engine's: spliced in unparsed.
        request, response = _as_json(request_body), _as_json(answer)
        rewritten: Any = None
        for rule in rules:
            fields = {"phase": "post", "guardrail_id": rule.id, "request_id": request_id, "model": model}
            payload = _envelope(fields, request=request, response=response)
            new = await self._judge(rule, payload, model, request_id, note)
            if new is not None:
                rewritten = new
                response = fastjson.dumps(new)
        return json.dumps(rewritten).encode() if rewritten is not None else answer

    def log(
        self,
        policy: Rules,
        request_id: str,
        model: str,
        request_body: bytes,
        answer: bytes | None = None,
        status: int | None = None,
    ) -> None:
        """Send the exchange to every ``logging_only`` webhook in the background; returns at once."""
        rules = _rules(policy, "logging_only")
        if not rules:
            return
        payload = {
            "phase": "logging_only",
            "guardrail_id": "",
            "request_id": request_id,
            "model": model,
            "request": _json_or_text(request_body),
            "response": _json_or_text(answer),
            "status": status,
        }
        for rule in rules:
            if len(self._pending) >= MAX_PENDING_LOGS:
                self.dropped_logs += 1
                continue
            task = asyncio.get_running_loop().create_task(
                self._log_one(rule, {**payload, "guardrail_id": rule.id}, request_id)
            )
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _log_one(self, rule: GuardrailRule, payload: dict[str, Any], request_id: str) -> None:
        try:
            await self._call(rule, json.dumps(payload).encode(), request_id)
        except _WebhookFailed as err:
            log.warning("logging guardrail %r: %s", rule.id, err)

    # --- one webhook ------------------------------------------------------------------------

    async def _judge(
        self, rule: GuardrailRule, payload: bytes, model: str, request_id: str, note: GuardNote | None
    ) -> Any | None:
        """None to go on unchanged, a new body for a rewrite; raises a refusal for a block or a closed failure."""
        if note is None:
            note = GuardNote()  # a caller that does not ask: the same decisions, told to no one
        started = time.perf_counter()
        try:
            try:
                answer = await self._call(rule, payload, request_id)
            finally:
                note.seconds += time.perf_counter() - started
            action = answer.get("action", "allow") if answer else "allow"
            if action == "allow":
                note.saw("allow", rule)
                return None
            assert answer is not None
            reason = answer.get("reason")
            reason = reason if isinstance(reason, str) else ""
            if action == "block":
                note.saw("block", rule, reason)
                raise GuardrailBlocked(rule.id, rule.phase, reason)
            if action == "rewrite":
                body = answer.get("body")
                if not isinstance(body, dict):
                    raise _WebhookFailed("it answered rewrite without a JSON object in body")
                if rule.phase == "pre" and body.get("model", model) != model:
                    raise _WebhookFailed(f"its rewrite changed the model to {body.get('model')!r}")
                note.saw("rewrite", rule, reason)
                return body
            raise _WebhookFailed(f"it answered an unknown action {action!r} (allow, block or rewrite)")
        except _WebhookFailed as err:
            if rule.fail_open:
                log.warning("guardrail %r failed open for %s: %s", rule.id, request_id, err)
                note.saw("failed_open", rule, str(err))
                return None
            note.saw("unavailable", rule, str(err))
            raise GuardrailUnavailable(rule.id, str(err)) from None

    def _webhook(self, rule: GuardrailRule) -> _Webhook:
        found = self._webhooks.get(id(rule))
        if found is None:
            if len(self._webhooks) >= MAX_WEBHOOKS:
                self._webhooks.clear()  # rules of policies replaced since
            found = self._webhooks[id(rule)] = _webhook(rule)
        return found

    async def _call(self, rule: GuardrailRule, payload: bytes, request_id: str) -> dict[str, Any] | None:
        timeout_ms = rule.timeout_ms or DEFAULT_TIMEOUT_MS
        try:
            hook = self._webhook(rule)
            async with asyncio.timeout(timeout_ms / 1000):
                resp = await self.upstream.post(hook.origin, hook.target, payload, hook.header_lines(request_id))
                status = resp.status
                try:
                    data = await _read_capped(resp)
                finally:
                    resp.release()
        except TimeoutError:
            raise _WebhookFailed(f"no answer within {timeout_ms} ms") from None
        except OSError as err:  # UpstreamError included: it is a ConnectionError
            raise _WebhookFailed(f"cannot reach {rule.url}: {err or type(err).__name__}") from None
        if not 200 <= status < 300:
            raise _WebhookFailed(f"it answered HTTP {status}")
        if not data.strip():
            return None
        try:
            answer = fastjson.loads(data)
        except ValueError:
            raise _WebhookFailed("its answer is not JSON") from None
        if not isinstance(answer, dict):
            raise _WebhookFailed("its answer is not a JSON object")
        return answer
