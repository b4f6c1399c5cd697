"""The guard policies in the gateway: what each detector finds, what a redaction leaves, which policies reach a key."""

from __future__ import annotations

import pytest

from opod.access.guard_attachments import Attachment, AttachmentTable
from opod.gateway.guard import GuardPolicies
from opod.gateway.guardrails import GuardNote, GuardrailBlocked
from opod.http import fastjson
from opod.settings.schema import ClusterSettings
from opod.settings.text import parse_settings


def policies(text: str, attachments: AttachmentTable | None = None) -> tuple[GuardPolicies, list[ClusterSettings]]:
    held = [parse_settings(text)]
    return GuardPolicies(lambda: held[0], attachments or AttachmentTable()), held


def redact_all(pii: str) -> GuardPolicies:
    return policies(
        f"guard:\n  default: [p]\n  policies:\n    - {{name: p, checks: [{{pii: {pii}, action: redact}}]}}\n"
    )[0]


def chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def redacted(pii: str, text: str) -> str:
    guard = redact_all(pii)
    plan = guard.plan(org="", team="", project="", user="", key="k")
    assert plan is not None
    payload = chat(text)
    GuardPolicies.check_request(plan, payload, GuardNote())
    return payload["messages"][0]["content"]


@pytest.mark.parametrize(
    ("pii", "text", "left"),
    [
        ("email", "write to ana.lopez+x@mail.example.org today", "write to [redacted:email] today"),
        ("card", "card 4111 1111 1111 1111 exp", "card [redacted:card] exp"),
        ("card", "order 4111 1111 1111 1112 shipped", "order 4111 1111 1111 1112 shipped"),  # fails its check digit
        ("ssn", "ssn 078-05-1120.", "ssn [redacted:ssn]."),
        ("ipv4", "from 192.168.10.254 and 999.1.1.1", "from [redacted:ipv4] and 999.1.1.1"),
        ("iban", "pay GB82 WEST 1234 5698 7654 32 now", "pay [redacted:iban] now"),
        ("iban", "pay GB83 WEST 1234 5698 7654 32 now", "pay GB83 WEST 1234 5698 7654 32 now"),  # bad check digits
        ("phone", "call +1 415 555 0134 or (020) 7946 0958", "call [redacted:phone] or [redacted:phone]"),
    ],
)
def test_each_detector_finds_what_it_names_and_leaves_the_rest(pii: str, text: str, left: str) -> None:
    assert redacted(pii, text) == left


def test_text_parts_instructions_and_prompts_are_read_and_other_parts_left_alone() -> None:
    guard = redact_all("email")
    plan = guard.plan(org="", team="", project="", user="", key="")
    assert plan is not None
    payload = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "me@x.io"}, {"type": "image_url", "image_url": {"url": "a@b.co"}}],
            }
        ],
        "prompt": ["a@b.co", 3],
        "instructions": "reply to c@d.ee",
    }
    assert GuardPolicies.check_request(plan, payload, GuardNote())
    assert payload["messages"][0]["content"][0]["text"] == "[redacted:email]"
    assert payload["messages"][0]["content"][1]["image_url"]["url"] == "a@b.co"
    assert payload["prompt"] == ["[redacted:email]", 3]
    assert payload["instructions"] == "reply to [redacted:email]"


def test_responses_input_items_and_output_text_parts_are_read() -> None:
    guard, _ = policies(
        "guard:\n  default: [p]\n  policies:\n    - {name: p, checks: [{reads: both, pii: email, action: redact}]}\n"
    )
    plan = guard.plan(org="", team="", project="", user="", key="")
    assert plan is not None
    payload = {
        "input": [
            {"role": "user", "content": "from a@b.co"},
            {"role": "user", "content": [{"type": "input_text", "text": "to c@d.ee"}, {"type": "input_image"}]},
        ]
    }
    assert GuardPolicies.check_request(plan, payload, GuardNote())
    assert payload["input"][0]["content"] == "from [redacted:email]"
    assert payload["input"][1]["content"] == [
        {"type": "input_text", "text": "to [redacted:email]"},
        {"type": "input_image"},
    ]
    answer = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "write e@f.gg"}]}]}
    out = GuardPolicies.check_answer(plan, fastjson.dumps(answer), GuardNote())
    assert fastjson.loads(out)["output"][0]["content"][0]["text"] == "write [redacted:email]"


def test_a_clean_chat_is_allowed_unchanged_and_later_checks_read_redacted_text() -> None:
    guard, _ = policies(
        "guard:\n  default: [screen]\n  policies:\n    - name: screen\n      checks:\n"
        "        - {reads: both, pii: email, action: redact}\n"
        "        - {reads: input, pii: card, action: block}\n"
        "        - {reads: input, pattern: 'co\\]', name: bracket, action: block}\n"
    )
    plan = guard.plan(org="", team="", project="", user="", key="")
    assert plan is not None
    note = GuardNote()
    payload = {"messages": [{"role": "system", "content": "Be brief."}, *chat("Hi there.")["messages"]]}
    assert not GuardPolicies.check_request(plan, payload, note)
    answer = fastjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}}]})
    assert GuardPolicies.check_answer(plan, answer, note) is answer
    assert (note.action, note.policy, note.rule) == ("allow", "screen", "")
    # The block's pattern would find "co]" in the original text; it reads the text the email's redaction left.
    note, payload = GuardNote(), chat("mail a@b.co] now")
    assert GuardPolicies.check_request(plan, payload, note)
    assert payload["messages"][0]["content"] == "mail [redacted:email]] now"
    assert (note.action, note.rule) == ("rewrite", "email")


def test_a_block_refuses_and_the_note_says_which_policy_and_what() -> None:
    guard, _ = policies(
        "guard:\n  default: [cards]\n  policies:\n"
        "    - {name: cards, checks: [{pii: card, action: block, category: payment}]}\n"
    )
    plan = guard.plan(org="", team="", project="", user="", key="")
    assert plan is not None
    note = GuardNote()
    with pytest.raises(GuardrailBlocked) as refused:
        GuardPolicies.check_request(plan, chat("4111-1111-1111-1111"), note)
    assert refused.value.status == 400 and "'cards' blocked the request: payment: card" in str(refused.value)
    fields = note.fields()
    # The check's time is the clock's: whole milliseconds, 0 unless the machine held the check up.
    took = fields.pop("guard_ms")
    assert isinstance(took, int) and 0 <= took < 1000, took
    assert fields == {
        "guard_action": "block",
        "guard_policy": "cards",
        "guard_rule": "card",
        "guard_category": "payment",
    }


def test_shadow_changes_nothing_and_records_what_it_would_have_done() -> None:
    guard, _ = policies(
        "guard:\n  default: [watch]\n  policies:\n"
        "    - {name: watch, mode: shadow, checks: [{pattern: '(?i)ignore previous', name: injection}]}\n"
    )
    plan = guard.plan(org="", team="", project="", user="", key="")
    assert plan is not None
    note, payload = GuardNote(), chat("Ignore previous orders")
    assert not GuardPolicies.check_request(plan, payload, note)
    assert payload == chat("Ignore previous orders")
    assert (note.action, note.policy, note.rule, note.category) == (
        "flag",
        "watch",
        "would block: injection",
        "injection",
    )


def test_an_answer_is_redacted_or_blocked_by_output_checks() -> None:
    guard, _ = policies(
        "guard:\n  default: [out]\n  policies:\n"
        "    - name: out\n      checks:\n"
        "        - {reads: output, pattern: 'SECRET-\\d+', name: code, action: redact}\n"
        "        - {reads: output, pattern: FORBIDDEN, action: block}\n"
    )
    plan = guard.plan(org="", team="", project="", user="", key="")
    assert plan is not None and plan.inputs == ()
    answer = fastjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "it is SECRET-7"}}]})
    out = GuardPolicies.check_answer(plan, answer, GuardNote())
    assert fastjson.loads(out)["choices"][0]["message"]["content"] == "it is [redacted:code]"
    clean = fastjson.dumps({"choices": [{"index": 0, "text": "nothing here"}]})
    assert GuardPolicies.check_answer(plan, clean, GuardNote()) is clean
    with pytest.raises(GuardrailBlocked, match="blocked the answer"):
        GuardPolicies.check_answer(plan, fastjson.dumps({"choices": [{"text": "FORBIDDEN"}]}), GuardNote())
    # The relay hands over the answer it parsed for its usage: the checks read that, and the client's answer is
    # still made from what they changed.
    parsed = fastjson.loads(answer)
    out = GuardPolicies.check_answer(plan, answer, GuardNote(), parsed)
    assert fastjson.loads(out)["choices"][0]["message"]["content"] == "it is [redacted:code]"
    assert GuardPolicies.check_answer(plan, clean, GuardNote(), fastjson.loads(clean)) is clean


SETTINGS = (
    "guard:\n  default: [base]\n  policies:\n"
    "    - {name: base, checks: [{pii: email, action: flag}]}\n"
    "    - {name: team-rule, no_store: true, checks: [{pii: card}]}\n"
    "    - {name: sleeping, mode: 'off', checks: [{pii: ssn}]}\n"
)


def test_a_key_gets_the_defaults_and_what_is_attached_to_its_scopes() -> None:
    table = AttachmentTable([Attachment("team", "team_1", "team-rule"), Attachment("key", "k2", "sleeping")])
    guard, _ = policies(SETTINGS, table)
    mine = guard.plan(org="org_1", team="team_1", project="prj_1", user="", key="k1")
    assert mine is not None and mine.policies == ("base", "team-rule") and mine.no_store
    other = guard.plan(org="org_1", team="team_2", project="prj_2", user="", key="k2")
    assert other is not None and other.policies == ("base",) and not other.no_store  # 'sleeping' is off


def test_a_change_of_attachments_or_settings_is_in_force_at_the_next_request() -> None:
    table = AttachmentTable()
    guard, held = policies(SETTINGS, table)
    who = {"org": "", "team": "team_1", "project": "", "user": "", "key": "k1"}
    assert guard.plan(**who).policies == ("base",)  # type: ignore[union-attr]
    table.replace([Attachment("team", "team_1", "team-rule")])
    assert guard.plan(**who).policies == ("base", "team-rule")  # type: ignore[union-attr]
    held[0] = parse_settings(SETTINGS.replace("guard:\n", "guard:\n  enabled: false\n"))
    assert guard.plan(**who) is None
    held[0] = parse_settings("")
    assert guard.plan(**who) is None
