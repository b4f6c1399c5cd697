"""The settings' guard section: policies of checks, refused with the field and the reason when they cannot work."""

from __future__ import annotations

import pytest

from opod.settings.text import SettingsInvalid, parse_settings


def test_a_policy_of_checks_reads_as_written() -> None:
    settings = parse_settings(
        "guard:\n"
        "  default: [personal-data]\n"
        "  policies:\n"
        "    - name: personal-data\n"
        "      mode: shadow\n"
        "      checks:\n"
        "        - {reads: both, pii: email, action: redact}\n"
        "        - {pattern: '(?i)ignore previous', name: injection, category: prompt_injection}\n"
    )
    policy = settings.guard.policy("personal-data")
    assert policy is not None and policy.mode == "shadow"
    assert [c.describe() for c in policy.checks] == [
        "both: pii email → redact",
        "input: pattern injection → block",
    ]
    assert settings.guard.enabled and settings.guard.default == ["personal-data"]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("guard: {default: [nowhere]}", "guard: default names ['nowhere'] but guard.policies has no such policy"),
        ("guard: {policies: [{name: a}, {name: a}]}", "policy 'a' is named twice"),
        (
            "guard: {policies: [{name: a, checks: [{pii: email, pattern: x}]}]}",
            "guard.policies[0].checks[0]: a check names exactly one of pii",
        ),
        ("guard: {policies: [{name: a, checks: [{}]}]}", "guard.policies[0].checks[0]: a check names exactly one"),
        (
            "guard: {policies: [{name: a, checks: [{pattern: '('}]}]}",
            "pattern '(' is not a regular expression",
        ),
        ("guard: {policies: [{name: a, checks: [{pii: passport}]}]}", "guard.policies[0].checks[0].pii"),
        ("guard: {policies: [{name: a, judge: llama-guard}]}", "judge models are not built into this opod yet"),
        ("guard: {policies: [{name: 'a b'}]}", "'a b' is not a policy name"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_naming_the_field(body: str, said: str) -> None:
    with pytest.raises(SettingsInvalid) as refused:
        parse_settings(body)
    assert said in str(refused.value)
