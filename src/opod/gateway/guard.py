"""The guard library's policies (the settings' ``guard``), run in the gateway itself: no call leaves the leader.

A request is checked by the ``default`` policies and by those attached to its organization, team,
project, person or key (:mod:`opod.access.guard_attachments`), each once, in that order. Each policy's
checks run in order on the request's text before any engine sees it (``input``), and on a whole
answer's text before the client gets it (``output``; a streamed answer has gone out as it came, so
only its request is checked):

- ``block``: the request (or the answer) is refused with 400 ``guardrail_blocked``, naming the policy
  and what it found; nothing further is checked.
- ``redact``: each finding is replaced by ``[redacted:<rule>]`` and the request goes on with the new
  text; later checks read the redacted text. The body kept for the request is the redacted one.
- ``flag``: only recorded.

A policy in ``shadow`` mode changes nothing: what it would have done is recorded as a ``flag`` whose
rule says so (``would block: injection``). A policy whose ``no_store`` is set keeps the request's
bodies from being kept. What decided goes into the request's record through the :class:`GuardNote`
the guardrail webhooks use too (``guard_action``, ``guard_policy``, ``guard_category``, ``guard_rule``).

The text read: a chat's messages (text content and text parts), a completion's prompt, an embedding's
input, a Responses request's input (text and ``input_text`` parts); an answer's choices' message content
or text, and a Responses answer's ``output_text`` parts.

What applies to a key is resolved once per key and kept until the settings or the attachments change, so a
request whose key no policy reaches costs one dictionary lookup.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opod.access.guard_attachments import AttachmentTable
from opod.gateway.guardrails import GuardNote, GuardrailBlocked
from opod.http import fastjson
from opod.settings.guard import GuardCheck, GuardPolicy
from opod.settings.schema import ClusterSettings

KEPT_RESOLUTIONS = 10_000
"""Keys whose applying policies are kept at most; past it the cache starts again (keys made by the thousand)."""


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(found: str) -> bool:
    digits = re.sub(r"[ -]", "", found)
    return 13 <= len(digits) <= 19 and _luhn(digits)


def _iban(found: str) -> bool:
    text = found.replace(" ", "")
    moved = text[4:] + text[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return 15 <= len(text) <= 34 and int(number) % 97 == 1


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"


@dataclass(frozen=True, slots=True)
class Detector:
    """What a check looks for: its pattern (a built-in detector's, or the check's own); a test of what it found, where
    a pattern alone finds too much (card numbers and IBANs carry check digits); and a character every finding holds,
    so a text without it is passed over without running the pattern (most texts hold no ``@``)."""

    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None = None
    needs: str = ""

    def findings(self, text: str) -> list[re.Match[str]]:
        if self.needs and self.needs not in text:
            return []
        found = self.pattern.finditer(text)
        if self.valid is None:
            return list(found)
        valid = self.valid
        return [m for m in found if valid(m.group())]


DETECTORS: dict[str, Detector] = {
    "email": Detector(re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), needs="@"),
    "phone": Detector(
        re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{2,4}\)|\d{2,4})[ .-]?\d{3,4}[ .-]?\d{3,4}(?!\w)")
    ),
    "card": Detector(re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), _card),
    "ssn": Detector(re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])"), needs="-"),
    "ipv4": Detector(re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d.])"), needs="."),
    "iban": Detector(re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b"), _iban),
}
"""The built-in detectors a check's ``pii`` names (``opod.settings.schema.PII_KINDS``)."""


@dataclass(frozen=True, slots=True)
class _Check:
    policy: str
    shadow: bool
    detector: Detector
    action: str
    rule: str
    category: str
    replacement: str


def _compiled(policy: GuardPolicy, check: GuardCheck) -> _Check:
    detector = DETECTORS[check.pii] if check.pii else Detector(re.compile(check.pattern))
    rule = check.rule
    return _Check(
        policy.name,
        policy.mode == "shadow",
        detector,
        check.action,
        rule,
        check.category or ("pii" if check.pii else rule),
        f"[redacted:{rule}]",
    )


@dataclass(frozen=True, slots=True)
class GuardPlan:
    """What the policies that apply to one key check, compiled: input and output checks in order."""

    policies: tuple[str, ...]
    inputs: tuple[_Check, ...]
    outputs: tuple[_Check, ...]
    no_store: bool


def _plan(settings: ClusterSettings, names: tuple[str, ...]) -> GuardPlan | None:
    inputs: list[_Check] = []
    outputs: list[_Check] = []
    applied: list[str] = []
    no_store = False
    for name in names:
        policy = settings.guard.policy(name)
        if policy is None or policy.mode == "off":
            continue  # an attachment of a policy the settings no longer hold, or one turned off
        applied.append(name)
        no_store = no_store or policy.no_store
        for check in policy.checks:
            compiled = _compiled(policy, check)
            if check.reads in ("input", "both"):
                inputs.append(compiled)
            if check.reads in ("output", "both"):
                outputs.append(compiled)
    if not applied:
        return None
    return GuardPlan(tuple(applied), tuple(inputs), tuple(outputs), no_store)


class GuardPolicies:
    """The settings' guard policies for each request; one per gateway."""

    def __init__(self, settings: Callable[[], ClusterSettings], attachments: AttachmentTable) -> None:
        self.settings = settings
        self.attachments = attachments
        self._made_for: tuple[object, int] = (None, -1)
        self._plans: dict[tuple[str, str, str, str, str], GuardPlan | None] = {}

    def plan(self, *, org: str, team: str, project: str, user: str, key: str) -> GuardPlan | None:
        """The checks that apply to a request of this caller; ``None`` when no policy does."""
        current = self.settings()
        attachments = self.attachments
        if self._made_for[0] is not current or self._made_for[1] != attachments.version:
            self._made_for = (current, attachments.version)
            self._plans = {}
        who = (org, team, project, user, key)
        try:
            return self._plans[who]
        except KeyError:
            pass
        guard = current.guard
        plan = None
        if guard.enabled and guard.policies:
            attached = attachments.policies_for(org=org, team=team, project=project, user=user, key=key)
            plan = _plan(current, tuple(dict.fromkeys((*guard.default, *attached))))
        if len(self._plans) >= KEPT_RESOLUTIONS:
            self._plans.clear()
        self._plans[who] = plan
        return plan

    @staticmethod
    def check_request(plan: GuardPlan, payload: dict[str, Any], note: GuardNote) -> bool:
        """Run the input checks on ``payload``'s text; True when a redaction changed it. Raises
        :class:`GuardrailBlocked` for an enforced block."""
        if not plan.inputs:
            note.found("allow", plan.policies[0])
            return False
        started = time.perf_counter()
        try:
            return _run(plan.inputs, _request_texts(payload), note, "pre", plan.policies[0])
        finally:
            note.seconds += time.perf_counter() - started

    @staticmethod
    def check_answer(plan: GuardPlan, answer: bytes, note: GuardNote, parsed: dict[str, Any] | None = None) -> bytes:
        """The answer to give the client: ``answer`` itself, or its redacted form; raises :class:`GuardrailBlocked`
        for an enforced block. ``parsed``: ``answer``'s JSON object when the relay parsed it already (it may be
        changed here)."""
        if not plan.outputs:
            return answer
        started = time.perf_counter()
        try:
            try:
                if parsed is None:
                    parsed = fastjson.loads(answer)
            except ValueError:
                return answer  # not JSON: an engine's error text, with nothing of a model's answer to read
            if not isinstance(parsed, dict):
                return answer
            if _run(plan.outputs, _answer_texts(parsed), note, "post", plan.policies[0]):
                return fastjson.dumps(parsed)
            return answer
        finally:
            note.seconds += time.perf_counter() - started


Slot = tuple[Any, Any]
"""Where a text is: its container (a dict or a list) and its key or index there, so a redaction can replace it."""


def _run(checks: tuple[_Check, ...], slots: list[Slot], note: GuardNote, phase: str, first: str) -> bool:
    changed = False
    for check in checks:
        detector = check.detector
        for container, where in slots:
            text = container[where]
            # Most texts hold nothing a check looks for: they are passed over here, without calling ``findings``
            # (a detector with no character it needs has ``needs`` "", which every text holds).
            if detector.needs not in text or detector.pattern.search(text) is None:
                continue
            found = detector.findings(text)
            if not found:
                continue
            if check.shadow:
                note.found("flag", check.policy, f"would {check.action}: {check.rule}", check.category)
                break
            if check.action == "block":
                note.found("block", check.policy, check.rule, check.category)
                raise GuardrailBlocked(check.policy, phase, f"{check.category}: {check.rule}")
            if check.action == "redact":
                container[where] = _redacted(text, found, check.replacement)
                note.found("rewrite", check.policy, check.rule, check.category)
                changed = True
            else:
                note.found("flag", check.policy, check.rule, check.category)
    note.found("allow", first)
    return changed


def _redacted(text: str, found: list[re.Match[str]], replacement: str) -> str:
    parts, at = [], 0
    for m in found:
        parts.append(text[at : m.start()])
        parts.append(replacement)
        at = m.end()
    parts.append(text[at:])
    return "".join(parts)


def _add_parts(content: Any, slots: list[Slot]) -> None:
    """The text of a message's content that is not a string: each text part's when a list of parts."""
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                if isinstance(part.get("text"), str):
                    slots.append((part, "text"))


def _request_texts(payload: dict[str, Any]) -> list[Slot]:
    """Where the request's texts are, in order; gathered into a list rather than yielded, since a generator's every
    resume is a call."""
    slots: list[Slot] = []
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                if isinstance(content, str):
                    slots.append((message, "content"))
                else:
                    _add_parts(content, slots)
    for field in ("prompt", "input"):
        value = payload.get(field)
        if isinstance(value, str):
            slots.append((payload, field))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    slots.append((value, i))
                elif isinstance(item, dict):  # a Responses input item
                    content = item.get("content")
                    if isinstance(content, str):
                        slots.append((item, "content"))
                    else:
                        _add_parts(content, slots)
    if isinstance(payload.get("instructions"), str):
        slots.append((payload, "instructions"))
    return slots


def _answer_texts(answer: dict[str, Any]) -> list[Slot]:
    slots: list[Slot] = []
    choices = answer.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            message = choice.get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                slots.append((message, "content"))
            if isinstance(choice.get("text"), str):
                slots.append((choice, "text"))
    output = answer.get("output")
    if isinstance(output, list):
        for item in output:
            if isinstance(item, dict):
                _add_parts(item.get("content"), slots)
    return slots
