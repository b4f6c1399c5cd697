"""``opod ctl guard`` against one real leader: the settings' policies shown with their checks, one attached to a
project and listed by the project's name, detached, a refusal as the operator sees it, and what the guards did.

The policies are put in the settings with ``opod ctl settings edit``, as an operator does; the commands run in this
process (typer's runner) with only the leader's address and key in the environment. A simulator worker that echoes
the message back serves one model, so a chat request through a key of the project is what the policy checks.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner, Result

from opod.cli.ctl import app
from opod.contract.admin.services import GuardAttachment, GuardEventsView, GuardView
from tests.support.ctl import serving_leader
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import wait_until

RUNNER = CliRunner()
MODEL = "ctl-guard"
GUARD = """\
guard:
  default: [watch]
  policies:
    - name: personal-data
      no_store: true
      checks:
        - {reads: input, pii: email, action: redact}
        - {reads: both, pattern: 'SECRET-\\d+', name: secret-code, category: leak, action: block}
    - name: watch
      mode: shadow
      fail: open
      checks:
        - {pattern: '(?i)ignore previous instructions', name: injection, category: prompt_injection, action: flag}
"""


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    """The leader, with an echoing simulator worker joining and its model being placed while the first tests run,
    and the project acme/ml/chat."""
    echo = json.dumps({"time_scale": 0.0, "mode": "echo"})
    with serving_leader(tmp_path_factory.mktemp("ctl-guard"), MODEL, "n_ctl_guard", OPOD_ENGINE_FLAGS=echo) as up:
        for where, made in (
            ("/api/v1/orgs", {"name": "acme"}),
            ("/api/v1/teams", {"name": "ml", "in": "acme"}),
            ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ):
            status, body = up.admin("POST", where, made)
            assert status == 201, body
        yield up


@pytest.fixture(scope="module")
def policies(leader: Leader, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The guard section put in the settings with ``opod ctl settings edit --file``; the project's ID."""
    file: Path = tmp_path_factory.mktemp("ctl-guard-settings") / "settings.yaml"
    file.write_text(ok(ctl(leader, "settings", "show")) + GUARD)  # its first line records the version it was made on
    ok(ctl(leader, "settings", "edit", "--file", str(file), "--note", "guard"))
    status, body = leader.admin("GET", "/api/v1/orgs")
    assert status == 200, body
    return next(p["id"] for o in body for t in o["teams"] for p in t["projects"] if p["path"] == "acme/ml/chat")


def ctl(leader: Leader, *args: str) -> Result:
    environ = {"OPOD_ADMIN_URL": leader.admin_url, "OPOD_ADMIN_KEY": leader.key, "OPOD_HOME": str(leader.home)}
    return RUNNER.invoke(app, list(args), env=environ, catch_exceptions=False)


def ok(result: Result) -> str:
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def refused(result: Result) -> str:
    """A refusal as the operator sees it: exit 1, an ``error:`` line on stderr, nothing on stdout."""
    assert result.exit_code == 1, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stderr.startswith("error: ") and not result.stdout.strip(), result.stderr + result.stdout
    return " ".join(result.stderr.split())


def sections(shown: str) -> list[list[str]]:
    """The blocks of an output (separated by a blank line), each as its lines."""
    return [block.splitlines() for block in shown.strip("\n").split("\n\n")]


def cells(line: str) -> list[str]:
    """A table row's cells (columns split on two or more spaces)."""
    return re.split(r"\s{2,}", line.strip())


def test_before_any_policy_each_command_says_what_to_do(leader: Leader) -> None:
    shown = ok(ctl(leader, "guard", "show"))
    assert re.search(r"^enabled\s+yes$", shown, re.M) and re.search(r"^default\s+none", shown, re.M), shown
    assert "no policies: add them under guard.policies (opod ctl settings edit" in shown, shown
    assert "no attachments: opod ctl guard attach project:ORG/TEAM/PROJECT POLICY" in shown, shown
    assert ok(ctl(leader, "guard", "events")).startswith("no requests checked by a guard since "), "no request yet"


def test_show_lists_each_policy_with_its_check_lines_and_the_default_ones(leader: Leader, policies: str) -> None:
    shown = ok(ctl(leader, "guard", "show"))
    about, table, attachments = sections(shown)
    assert [cells(line) for line in about] == [["enabled", "yes"], ["default", "watch"]], shown
    assert cells(table[0]) == ["POLICY", "MODE", "FAIL", "NO STORE", "DEFAULT", "CHECKS"], shown
    assert cells(table[1]) == ["personal-data", "enforce", "closed", "yes", "no", "input: pii email → redact"]
    assert cells(table[2]) == ["both: pattern secret-code → block"], shown  # the next check, a line of its own
    assert cells(table[3]) == ["watch", "shadow", "open", "no", "yes", "input: pattern injection → flag"], shown
    assert attachments[0].startswith("SCOPE") and "no attachments" in attachments[-1], shown
    view = GuardView.model_validate(json.loads(ok(ctl(leader, "guard", "show", "--json"))))
    assert view.policies == ["personal-data", "watch"] and view.default == ["watch"] and not view.attachments


def test_a_policy_attached_to_a_project_is_listed_by_its_name_until_detached(leader: Leader, policies: str) -> None:
    chat = f"project:{policies}"
    attached = ok(ctl(leader, "guard", "attach", "project:acme/ml/chat", "personal-data")).strip()
    assert attached == f"attached personal-data to project:acme/ml/chat ({chat})", attached
    again = GuardAttachment.model_validate(
        json.loads(ok(ctl(leader, "guard", "attach", chat, "personal-data", "--json")))
    )  # attached already: the same attachment
    assert (again.Scope, again.ScopeID, again.Policy) == ("project", policies, "personal-data")

    table = sections(ok(ctl(leader, "guard", "show")))[2]
    assert [cells(line) for line in table] == [["SCOPE", "NAME", "POLICY"], [chat, "acme/ml/chat", "personal-data"]]
    (listed,) = GuardView.model_validate(json.loads(ok(ctl(leader, "guard", "show", "--json")))).attachments or []
    assert (listed.Scope, listed.ScopeID, listed.Policy, listed.name) == (
        "project",
        policies,
        "personal-data",
        "acme/ml/chat",
    )

    detached = ok(ctl(leader, "guard", "detach", "project:acme/ml/chat", "personal-data")).strip()
    assert detached == f"detached personal-data from project:acme/ml/chat ({chat})", detached
    assert "no attachments" in ok(ctl(leader, "guard", "show"))
    gone = refused(ctl(leader, "guard", "detach", "project:acme/ml/chat", "personal-data"))
    assert "is not attached to 'project:acme/ml/chat'" in gone and "(HTTP 404)" in gone, gone


def test_a_refused_attachment_prints_the_api_message_and_exits_1(leader: Leader, policies: str) -> None:
    unknown = refused(ctl(leader, "guard", "attach", "project:acme/ml/chat", "nosuch"))
    assert unknown.startswith("error: policy: 'nosuch' is not a policy of the settings' guard.policies"), unknown
    assert "(personal-data, watch)" in unknown and unknown.endswith("(HTTP 400)"), unknown
    nowhere = refused(ctl(leader, "guard", "attach", "project:acme/ml/nosuch", "personal-data"))
    assert "nosuch" in nowhere and "(HTTP 404)" in nowhere, nowhere
    assert "target" in refused(ctl(leader, "guard", "attach", "planet:earth", "personal-data"))
    assert ctl(leader, "guard", "attach", "project:acme/ml/chat").exit_code == 2  # no POLICY: a usage error


def test_events_count_what_the_policies_did_and_list_the_request(leader: Leader, policies: str) -> None:
    ok(ctl(leader, "guard", "attach", "project:acme/ml/chat", "personal-data"))
    made = leader.admin("POST", "/api/v1/keys", {"name": "guarded", "project": "acme/ml/chat"})
    assert made[0] == 201, made
    leader.wait_served(MODEL, timeout=90)
    request_id = "cg-" + secrets.token_hex(6)
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=made[1]["secret"], max_retries=0, timeout=30)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "mail ana.lopez@example.org please"}],
        max_tokens=64,
        extra_headers={"X-Request-Id": request_id},
    )
    assert "[redacted:email]" in (answer.choices[0].message.content or "")  # the echo of what the engine was sent

    def listed() -> GuardEventsView | None:
        found = GuardEventsView.model_validate(json.loads(ok(ctl(leader, "guard", "events", "--json"))))
        return found if any(e.request_id == request_id for e in found.events or []) else None

    wait_until(listed, 15, f"request {request_id} among the guard events")
    shown = ok(ctl(leader, "guard", "events", "--since", "1h"))
    (since, *counts), events = sections(shown)
    assert re.fullmatch(r"requests checked by a guard since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", since), shown
    assert cells(counts[0]) == ["PROJECT", "ACTION", "POLICY", "CATEGORY", "REQUESTS"], shown
    assert ["acme/ml/chat", "rewrite", "personal-data", "pii", "1"] in [cells(line) for line in counts[1:]], shown
    assert cells(events[0]) == [
        "AT",
        "REQUEST",
        "PROJECT",
        "MODEL",
        "STATUS",
        "ACTION",
        "POLICY",
        "CATEGORY",
        "RULE",
        "GUARD MS",
    ], shown
    (row,) = [cells(line) for line in events[1:] if request_id in line]
    assert row[1:9] == [request_id, "acme/ml/chat", MODEL, "200", "rewrite", "personal-data", "pii", "email"], row
    assert "since" in refused(ctl(leader, "guard", "events", "--since", "lately"))


def test_an_attachment_of_a_policy_gone_from_the_settings_is_shown_as_ignored(
    leader: Leader, policies: str, tmp_path: Path
) -> None:
    ok(ctl(leader, "guard", "attach", "project:acme/ml/chat", "personal-data"))
    shown = ok(ctl(leader, "settings", "show"))
    file = tmp_path / "settings.yaml"
    file.write_text(shown[: shown.index("guard:")] + "guard:\n  enabled: false\n")
    ok(ctl(leader, "settings", "edit", "--file", str(file), "--note", "no guard"))
    try:
        about, table, attachments = sections(ok(ctl(leader, "guard", "show")))
        assert cells(about[0]) == ["enabled", "no: guard.enabled is false, no policy checks anything"], about
        assert "no policies" in table[-1], table
        assert cells(attachments[1]) == [f"project:{policies}", "acme/ml/chat", "personal-data"], attachments
        note = " ".join(attachments[2:])
        assert "not in the settings' guard.policies, so ignored: personal-data" in note, attachments
        ok(ctl(leader, "guard", "detach", f"project:{policies}", "personal-data"))
        assert "no attachments" in ok(ctl(leader, "guard", "show"))
    finally:
        file.write_text(ok(ctl(leader, "settings", "show")).split("guard:")[0] + GUARD)
        ok(ctl(leader, "settings", "edit", "--file", str(file), "--note", "guard back"))
