"""The settings' ``guard`` section: the guard library's policies of checks, which the gateway runs itself
(``opod.gateway.guard``), and the ones every request gets."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from opod.settings.section import Section

PII_KINDS = ("email", "phone", "card", "ssn", "ipv4", "iban")
"""What a check's ``pii`` may name: the detectors ``opod.gateway.guard`` holds."""
_POLICY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class GuardCheck(Section):
    """One thing a guard policy looks for in a request's text or its answer's, and what it does on finding it."""

    reads: Literal["input", "output", "both"] = Field(
        "input", description="Which text it reads: the request's (input), the answer's (output), or both."
    )
    pii: Literal["", "email", "phone", "card", "ssn", "ipv4", "iban"] = Field(
        "", description="A built-in detector of personal data: email, phone, card, ssn, ipv4 or iban."
    )
    pattern: str = Field("", description="A regular expression (Python's syntax) to look for, in place of pii.")
    name: str = Field(
        "", description="The name the request's record gives what was found (the detector's when absent)."
    )
    category: str = Field(
        "", description="The category the request's record and the events count it under (pii, or the name)."
    )
    action: Literal["block", "redact", "flag"] = Field(
        "block",
        description="block refuses the request (400 guardrail_blocked); redact replaces what was found; flag only records it.",
    )

    @model_validator(mode="after")
    def _one_detector(self) -> GuardCheck:
        if bool(self.pii) == bool(self.pattern):
            raise ValueError("a check names exactly one of pii (a built-in detector) or pattern (a regular expression)")
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as err:
                raise ValueError(f"pattern {self.pattern!r} is not a regular expression: {err}") from None
        return self

    @property
    def rule(self) -> str:
        """What the request's record names as the rule that decided: the check's name, or its detector."""
        return self.name or self.pii or "pattern"

    def describe(self) -> str:
        """One line, as the management API shows it: ``input: pii email → redact``."""
        what = f"pii {self.pii}" if self.pii else f"pattern {self.name or self.pattern}"
        return f"{self.reads}: {what} → {self.action}"


class GuardPolicy(Section):
    """A named set of checks, run in the gateway itself (no call leaves the leader)."""

    name: str = Field(min_length=1, description="The policy's name, which attachments and default name it by.")
    mode: Literal["enforce", "shadow", "off"] = Field(
        "enforce",
        description="enforce acts on what the checks find; shadow only records what it would have done; off checks nothing.",
    )
    fail: Literal["open", "closed"] = Field(
        "closed",
        description="Whether a request goes on (open) or is refused (closed) when the policy cannot read it.",
    )
    no_store: bool = Field(False, description="A request this policy checks keeps no body, whatever retention says.")
    judge: str = Field(
        "", description="A judge model that reads the text; judges are not built yet, so it stays empty."
    )
    checks: list[GuardCheck] = Field(default_factory=list, description="What the policy looks for, in order.")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _POLICY_NAME.match(name):
            raise ValueError(f"{name!r} is not a policy name: letters, digits and ._- (at most 63)")
        return name

    @field_validator("judge")
    @classmethod
    def _no_judge(cls, judge: str) -> str:
        if judge:
            raise ValueError(
                "judge models are not built into this opod yet; use checks, or a guardrail webhook in the policy file"
            )
        return judge


class GuardSettings(Section):
    """The guard library: policies of checks the gateway runs on requests and answers, where they apply."""

    enabled: bool = Field(True, description="Whether the guard policies check anything; false turns them all off.")
    default: list[str] = Field(
        default_factory=list, description="Policies every request is checked by, by name, besides those attached."
    )
    policies: list[GuardPolicy] = Field(default_factory=list, description="The policies, each named once.")

    @model_validator(mode="after")
    def _names(self) -> GuardSettings:
        seen: set[str] = set()
        for policy in self.policies:
            if policy.name in seen:
                raise ValueError(f"policy {policy.name!r} is named twice; give each policy its own name")
            seen.add(policy.name)
        unknown = [name for name in self.default if name not in seen]
        if unknown:
            raise ValueError(f"default names {unknown} but guard.policies has no such policy")
        return self

    def policy(self, name: str) -> GuardPolicy | None:
        return next((p for p in self.policies if p.name == name), None)
