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
- ``flag``: a guard policy's check found something and only recorded it (``opod.gateway.guard``);
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
PHASES = ("pre", "post", "logging_only")

_ALLOW_ANSWERS = frozenset(
    (b'{"action":"allow"}', b'{"action": "allow"}', b'{"action":"allow"}\n', b'{"action": "allow"}\n')
)
"""The usual "allow" answers byte for byte: a webhook is called for every request and most of its answers are
one of these, so they are recognised without a parse. Any other answer is parsed."""


GUARD_ACTIONS = ("allow", "flag", "failed_open", "rewrite", "unavailable", "block")
"""The actions a :class:`GuardNote` may say, weakest first."""
_RANK = {"": -1} | {action: rank for rank, action in enumerate(GUARD_ACTIONS)}
"""Each action's strength; '' (no rule consulted yet) is weaker than any."""
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
        if _RANK[action] > _RANK[self.action]:
            self.action, self.policy, self.rule, self.category = action, rule.id, rule.phase, why[:MAX_GUARD_CATEGORY]

    def found(self, action: str, policy: str, rule: str = "", category: str = "") -> None:
        """A guard policy's check (``opod.gateway.guard``) took ``action``; it decides when it is stronger."""
        if _RANK[action] > _RANK[self.action]:
            self.action, self.policy, self.rule, self.category = action, policy, rule, category[:MAX_GUARD_CATEGORY]

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


def _as_json(body: bytes) -> bytes:
    """``body`` as JSON text for an envelope: itself when it is JSON already (an engine's answer), else as a string."""
    try:
        fastjson.loads(body)
    except ValueError:
        return fastjson.dumps(body.decode("utf-8", "replace"))
    return body


@dataclass(frozen=True, slots=True)
class _Webhook:
    """What every call to one rule's webhook sends alike, made once per rule: the rule's webhook is called for
    every request."""

    rule: GuardrailRule
    origin: Origin | None
    """None when the rule's URL is not http(s) (``unusable`` says so): every call fails."""
    target: str
    unusable: str
    headers: bytes
    """The header lines, encoded: the rule's own; ``X-Request-Id`` is added where the rule does not set it."""
    own_request_id: bool
    """The rule's headers set ``X-Request-Id``: the request's is not added."""
    head: bytes
    """The call's body up to the request's own fields: ``{"phase":…,"guardrail_id":…,``."""
    timeout_ms: int

    def failure(self, err: Exception) -> _WebhookFailed:
        """What a call that raised ``err`` (a timeout, or an ``OSError`` of the connection) tells."""
        if isinstance(err, TimeoutError):
            return _WebhookFailed(f"no answer within {self.timeout_ms} ms")
        return _WebhookFailed(f"cannot reach {self.rule.url}: {err or type(err).__name__}")


def _webhook(rule: GuardrailRule) -> _Webhook:
    headers = {"Content-Type": "application/json", "X-Opod-Guardrail": rule.id}
    if rule.auth_key:
        headers["Authorization"] = f"Bearer {rule.auth_key}"
    headers.update(rule.headers or {})
    own_request_id = any(name.lower() == "x-request-id" for name in headers)
    head = fastjson.dumps({"phase": rule.phase, "guardrail_id": rule.id})[:-1] + b","
    timeout_ms = rule.timeout_ms or DEFAULT_TIMEOUT_MS
    try:
        where: Origin | None
        where, target = split_url(rule.url)
        unusable = ""
    except OSError as err:  # UpstreamError: not an http(s) URL
        where, target = None, ""
        unusable = f"cannot reach {rule.url}: {err or type(err).__name__}"
    return _Webhook(rule, where, target, unusable, header_lines(headers), own_request_id, head, timeout_ms)


def _made_webhooks(policy: Rules, phase: str) -> tuple[_Webhook, ...]:
    """The webhooks of ``phase``'s rules, in the file's order."""
    if policy is None:
        return ()
    if isinstance(policy, PolicyView):
        return tuple(_webhook(r) for r in policy.guardrails_for(phase))
    rules = policy.guardrails if isinstance(policy, PolicySnapshot) else policy
    return tuple(_webhook(r) for r in rules or () if r.phase == phase)


async def _read_rest(resp: UpstreamResponse) -> bytes:
    """A webhook's answer that had not all arrived with its headers, at most :data:`MAX_ANSWER_BYTES` of it."""
    parts, size = [], 0
    try:
        while size < MAX_ANSWER_BYTES and (chunk := await resp.readany()):
            parts.append(chunk)
            size += len(chunk)
    finally:
        resp.release()
    return b"".join(parts)[:MAX_ANSWER_BYTES]


async def _send(hook: _Webhook, upstream: Upstreams, payload: bytes, headers: bytes) -> tuple[int, bytes]:
    """One call to ``hook``: the answer's status and body; :class:`_WebhookFailed` when there is none."""
    if hook.origin is None:
        raise _WebhookFailed(hook.unusable)
    try:
        resp = await upstream.post(hook.origin, hook.target, payload, headers, timeout=hook.timeout_ms / 1000)
        data = resp.read_now()
        if data is None:
            data = await _read_rest(resp)
    except (TimeoutError, OSError) as err:  # UpstreamError included: it is a ConnectionError
        raise hook.failure(err) from None
    return resp.status, data[:MAX_ANSWER_BYTES]


def _answer(status: int, data: bytes) -> dict[str, Any] | None:
    """A webhook's answer as the JSON object it is, None for an empty one; :class:`_WebhookFailed` when unusable."""
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


def _json_or_text(body: bytes | None) -> Any:
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")


def _request_fields(request_id: str, model: str) -> tuple[bytes, bytes]:
    """The request's own fields of a call's body (``"request_id":…,"model":…``) and its ``X-Request-Id`` line,
    made once for all the rules of a phase."""
    fields = fastjson.dumps({"request_id": request_id, "model": model})[1:-1]
    return fields, b"X-Request-Id: %s\r\n" % request_id.encode("latin-1")


class Guardrails:
    """Calls the policy's guardrail webhooks. One per leader; :meth:`close` at shutdown.

    The calls go over the same kind of keep-alive pool as the relay's (:mod:`opod.http.upstream`): a
    ``pre`` webhook is on every request's way, and a general client costs it more CPU than the relay.
    """

    def __init__(self, upstream: Upstreams | None = None) -> None:
        self.upstream = upstream or Upstreams()
        self._made: dict[str, tuple[object, tuple[_Webhook, ...]]] = {phase: (None, ()) for phase in PHASES}
        """Each phase's webhooks and the policy view they were made for. A new policy is a new view (a view is
        never changed), so they are made again when the view is another (also for the requests that finish under
        the old view while the new one is in)."""
        self._pending: set[asyncio.Task[None]] = set()
        self.dropped_logs = 0
        """``logging_only`` calls dropped because too many were in flight."""

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self.upstream.close()

    def _webhooks(self, policy: Rules, phase: str) -> tuple[_Webhook, ...]:
        """``phase``'s webhooks for ``policy``, kept when it is a view; rules given otherwise are made afresh."""
        hooks = _made_webhooks(policy, phase)
        if isinstance(policy, PolicyView):
            self._made[phase] = (policy, hooks)
        return hooks

    # --- the three phases ----------------------------------------------------------------

    async def pre(
        self, policy: Rules, request_id: str, model: str, body: bytes, note: GuardNote | None = None
    ) -> bytes:
        """The request body to send on (``body`` itself when nothing rewrote it); raises a refusal otherwise.

        ``note`` is told what each rule did, a refusal included."""
        made_for, hooks = self._made["pre"]
        if made_for is not policy:
            hooks = self._webhooks(policy, "pre")
        if not hooks:
            return body
        if note is None:
            note = GuardNote()  # a caller that does not ask: the same decisions, told to no one
        fields, id_line = _request_fields(request_id, model)
        for hook in hooks:
            # The request is the JSON object the gateway checked: it goes into the call as it is, unparsed.
            payload = b'%s%s,"request":%s,"response":null}' % (hook.head, fields, body)
            new = await self._judge(hook, payload, id_line, request_id, model, note)
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
        made_for, hooks = self._made["post"]
        if made_for is not policy:
            hooks = self._webhooks(policy, "post")
        if not hooks:
            return answer
        if note is None:
            note = GuardNote()
        # The request is the JSON the gateway relayed and the answer the engine's: spliced in unparsed.
        request, response = _as_json(request_body), _as_json(answer)
        fields, id_line = _request_fields(request_id, model)
        rewritten: Any = None
        for hook in hooks:
            payload = b'%s%s,"request":%s,"response":%s}' % (hook.head, fields, request, response)
            new = await self._judge(hook, payload, id_line, request_id, model, note)
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
        made_for, hooks = self._made["logging_only"]
        if made_for is not policy:
            hooks = self._webhooks(policy, "logging_only")
        if not hooks:
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
        for hook in hooks:
            if len(self._pending) >= MAX_PENDING_LOGS:
                self.dropped_logs += 1
                continue
            task = asyncio.get_running_loop().create_task(
                self._log_one(hook, {**payload, "guardrail_id": hook.rule.id}, request_id)
            )
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _log_one(self, hook: _Webhook, payload: dict[str, Any], request_id: str) -> None:
        headers = hook.headers
        if not hook.own_request_id:
            headers += b"X-Request-Id: %s\r\n" % request_id.encode("latin-1")
        try:
            _answer(*await _send(hook, self.upstream, json.dumps(payload).encode(), headers))
        except _WebhookFailed as err:
            log.warning("logging guardrail %r: %s", hook.rule.id, err)

    # --- one webhook ------------------------------------------------------------------------

    async def _judge(
        self, hook: _Webhook, payload: bytes, id_line: bytes, request_id: str, model: str, note: GuardNote
    ) -> Any | None:
        """None to go on unchanged, a new body for a rewrite; raises a refusal for a block or a closed failure.

        ``id_line`` is the request's ``X-Request-Id`` header line, sent where the rule does not set its own."""
        rule = hook.rule
        started = time.perf_counter()
        try:
            # The call is made here rather than through _send: this is every request's way, and each
            # coroutine between the phase and the connection is resumed again at every wait.
            if hook.origin is None:
                raise _WebhookFailed(hook.unusable)
            try:
                resp = await self.upstream.post(
                    hook.origin,
                    hook.target,
                    payload,
                    hook.headers if hook.own_request_id else hook.headers + id_line,
                    timeout=hook.timeout_ms / 1000,  # one timer for connecting, the head and the body
                )
                data = resp.read_now()
                if data is None:
                    data = await _read_rest(resp)
            except (TimeoutError, OSError) as err:  # UpstreamError included: it is a ConnectionError
                raise hook.failure(err) from None
            finally:
                note.seconds += time.perf_counter() - started
            status = resp.status
            if 200 <= status < 300 and data in _ALLOW_ANSWERS:
                note.saw("allow", rule)
                return None
            answer = _answer(status, data[:MAX_ANSWER_BYTES])
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
