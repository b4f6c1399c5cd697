"""``opod ctl`` for tenancy, people, keys, quotas, settings, audit, usage and jobs, against one real leader.

The commands run in this process (typer's runner) with only the leader's address and key in the
environment, so the module stays quick; ``test_the_installed_command_issues_a_key_shown_once``
runs the installed ``opod`` in its own process. Tables are read as a person reads them: a header,
then a row per thing; ``--json`` answers are parsed with the contract's types.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner, Result

from opod.cli.ctl import app, render
from opod.cli.ctl.api import actor
from opod.cli.ctl.usage import RowCounter, money
from opod.contract.admin.common import Removed
from opod.contract.admin.records import (
    JobView,
    NotifyResult,
    ScopeUsageView,
    SettingsView,
    StoreAuditEvent,
    StoreExportRow,
)
from opod.contract.admin.tenancy import KeyCreated, KeyView, OrgView, QuotaSet, QuotaView, TenancyItem, UserView
from tests.support.ctl import serving_leader
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OPOD, http, wait_until

RUNNER = CliRunner()
MODEL = "ctl-usage"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    """The leader, with a simulator worker joining and a model being placed while the first tests run."""
    with serving_leader(tmp_path_factory.mktemp("ctl-tenancy"), MODEL, "n_ctl_usage") as up:
        yield up


@pytest.fixture(scope="module")
def tree(leader: Leader) -> dict[str, str]:
    """acme / ml / chat, made through the commands; the IDs by name."""
    org = TenancyItem.model_validate(json.loads(ok(ctl(leader, "orgs", "add", "acme", "--json"))))
    line = ok(ctl(leader, "teams", "add", "ml", "--in", "acme")).strip()
    match = re.fullmatch(rf"created team ml \((\S+)\) in {org.id}", line)
    assert match, line
    project = ok(ctl(leader, "projects", "add", "chat", "--in", "acme/ml")).strip()
    found = re.fullmatch(rf"created project chat \((\S+)\) in {match.group(1)}", project)
    assert found, project
    assert org.id
    return {"acme": org.id, "ml": match.group(1), "chat": found.group(1)}


def ctl(leader: Leader, *args: str, stdin: str | None = None, **env: str) -> Result:
    environ = {"OPOD_ADMIN_URL": leader.admin_url, "OPOD_ADMIN_KEY": leader.key, "OPOD_HOME": str(leader.home), **env}
    return RUNNER.invoke(app, list(args), env=environ, input=stdin, catch_exceptions=False)


def ok(result: Result) -> str:
    assert result.exit_code == 0, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def refused(result: Result) -> str:
    """A refusal as the operator sees it: exit 1, an ``error:`` line on stderr, nothing on stdout."""
    assert result.exit_code == 1, f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stderr.startswith("error: ") and not result.stdout.strip(), result.stderr + result.stdout
    return " ".join(result.stderr.split())


def rows(table: str) -> tuple[list[str], dict[str, list[str]]]:
    """A table's header and its rows by first cell (columns split on two or more spaces)."""
    lines = [line for line in table.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0].strip())
    return header, {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[1:])}


def test_the_tenancy_tree_grows_moves_and_shrinks(leader: Leader, tree: dict[str, str]) -> None:
    shown = ok(ctl(leader, "orgs", "ls"))
    assert re.search(rf"^acme \({tree['acme']}\)  0 members$", shown, re.M), shown
    assert re.search(rf"^\W+ml \({tree['ml']}\)", shown, re.M), shown
    assert re.search(rf"^\W+chat \({tree['chat']}\)  acme/ml/chat, 0 users, 0/0 keys active$", shown, re.M), shown
    (acme,) = [
        o
        for o in (OrgView.model_validate(o) for o in json.loads(ok(ctl(leader, "orgs", "ls", "--json"))))
        if o.name == "acme"
    ]
    assert [(t.name, [p.path for p in t.projects or []]) for t in acme.teams or []] == [("ml", ["acme/ml/chat"])]

    beta = TenancyItem.model_validate(json.loads(ok(ctl(leader, "orgs", "add", "beta", "--json"))))
    team = TenancyItem.model_validate(json.loads(ok(ctl(leader, "teams", "add", "ops", "--in", "acme", "--json"))))
    assert ok(ctl(leader, "teams", "mv", str(team.id), "--in", "beta")).strip() == f"team {team.id}: ops in {beta.id}"
    assert ok(ctl(leader, "teams", "rename", str(team.id), "infra")).strip().startswith(f"team {team.id}: infra")
    side = TenancyItem.model_validate(
        json.loads(ok(ctl(leader, "projects", "add", "tmp", "--in", "beta/infra", "--json")))
    )
    assert side.in_ == team.id
    assert (
        ok(ctl(leader, "projects", "rename", str(side.id), "scratch")).strip().startswith(f"project {side.id}: scratch")
    )
    assert re.search(r"^\W+scratch \(\S+\)  beta/infra/scratch", ok(ctl(leader, "orgs", "ls")), re.M)

    busy = refused(ctl(leader, "orgs", "rm", "beta"))
    assert "(HTTP 409)" in busy, busy
    unknown = refused(ctl(leader, "projects", "add", "x", "--in", "nosuch/team"))
    assert "nosuch" in unknown and re.search(r"\(HTTP 40[04]\)", unknown), unknown
    assert ok(ctl(leader, "projects", "rm", str(side.id))).strip() == f"removed project {side.id}"
    assert ok(ctl(leader, "teams", "rm", str(team.id))).strip() == f"removed team {team.id}"
    assert ok(ctl(leader, "orgs", "rm", "beta")).strip() == "removed org beta"
    assert "beta" not in ok(ctl(leader, "orgs", "ls"))


def test_a_project_key_is_shown_once_listed_and_revoked(leader: Leader, tree: dict[str, str]) -> None:
    made = ctl(leader, "keys", "create", "web", "--project", "acme/ml/chat", "--expires-in", "720h")
    secret = ok(made).strip()
    assert "\n" not in secret and len(secret) > 20, made.stdout
    assert "not shown again" in made.stderr and "in acme/ml/chat" in made.stderr, made.stderr
    key_id = re.search(r"created key (\S+)", made.stderr).group(1)  # type: ignore[union-attr]

    header, found = rows(ok(ctl(leader, "keys", "ls", "--project", "acme/ml/chat")))
    assert header == ["ID", "NAME", "PREFIX", "PROJECT", "USER", "BAND", "ROUTING", "STATE", "EXPIRES", "LAST USED"]
    assert found[key_id][1] == "web" and found[key_id][3] == "acme/ml/chat", found
    listed = [KeyView.model_validate(k) for k in json.loads(ok(ctl(leader, "keys", "ls", "--json")))]
    assert any(k.id == key_id and k.project == tree["chat"] for k in listed)
    assert secret not in ok(ctl(leader, "keys", "ls", "--json"))
    assert re.search(r"^project\s+acme/ml/chat$", ok(ctl(leader, "keys", "show", key_id)), re.M)

    as_json = KeyCreated.model_validate(
        json.loads(ok(ctl(leader, "keys", "create", "batch", "--project", tree["chat"], "--json")))
    )
    assert as_json.secret and as_json.project == tree["chat"]
    assert ok(ctl(leader, "keys", "revoke", key_id)).strip() == f"revoked {key_id}"
    assert KeyView.model_validate(json.loads(ok(ctl(leader, "keys", "show", key_id, "--json")))).state == "revoked"
    wrong = refused(ctl(leader, "keys", "create", "bad", "--project", "acme/ml/nosuch"))
    assert "project" in wrong and "nosuch" in wrong, wrong
    late = refused(ctl(leader, "keys", "create", "bad", "--expires-in", "soon"))
    assert "expires_in" in late and "(HTTP 400)" in late, late


def test_the_installed_command_issues_a_key_shown_once(leader: Leader, tree: dict[str, str]) -> None:
    done = subprocess.run(
        [*OPOD, "ctl", "keys", "create", "cli", "--project", "acme/ml/chat"],
        env=leader.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "not shown again" in done.stderr and done.stdout.strip() and done.stdout.strip() not in done.stderr
    status, body = leader.admin("GET", "/api/v1/audit?contains=/api/v1/keys")
    assert status == 200 and any(e["actor"] == actor() and e["action"] == "POST /api/v1/keys" for e in body), body  # type: ignore[attr-defined]


def test_people_arrive_through_scim_and_get_memberships(leader: Leader, tree: dict[str, str]) -> None:
    token = "scim-ctl-token-0123456789"
    assert (
        ok(ctl(leader, "secrets", "set", "scim-token", stdin=token + "\n")).strip()
        == "stored scim-token; settings name it as store:auth/scim-token"
    )
    empty = refused(ctl(leader, "secrets", "set", "nosuch", stdin="x\n"))
    assert "nosuch" in empty, empty
    status, _, body = http(
        "POST",
        f"{leader.url}/scim/v2/Users",
        {
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
            "userName": "ada@example.com",
            "active": True,
            "name": {"formatted": "Ada Lovelace"},
            "emails": [{"value": "ada@example.com", "primary": True}],
        },
        key=token,
    )
    assert status == 201, body

    header, found = rows(ok(ctl(leader, "users", "ls")))
    assert header == ["ID", "EMAIL", "NAME", "STATE", "ROLE", "MEMBER OF", "LAST LOGIN"]
    (ada,) = [r for r in found.values() if r[1] == "ada@example.com"]
    assert ada[3] == "active", ada
    assert [
        u.email
        for u in (
            UserView.model_validate(u)
            for u in json.loads(ok(ctl(leader, "users", "ls", "--state", "active", "--json")))
        )
    ] == ["ada@example.com"]
    granted = ok(ctl(leader, "users", "grant", "ada@example.com", "project:acme/ml/chat", "--role", "manager"))
    assert re.search(r"^MEMBER OF\s+PATH\s+ROLE", granted, re.M) and re.search(r"acme/ml/chat\s+manager", granted), (
        granted
    )
    view = UserView.model_validate(json.loads(ok(ctl(leader, "users", "show", "ada@example.com", "--json"))))
    assert [(m.target, m.role) for m in view.memberships or []] == [(tree["chat"], "manager")] or [
        (m.path, m.role) for m in view.memberships or []
    ] == [("acme/ml/chat", "manager")], view
    wrong = refused(ctl(leader, "users", "grant", "ada@example.com", "project:acme/ml/chat", "--role", "owner"))
    assert "role" in wrong and "(HTTP 400)" in wrong, wrong
    revoked = UserView.model_validate(
        json.loads(ok(ctl(leader, "users", "revoke", "ada@example.com", "project:acme/ml/chat", "--json")))
    )
    assert not revoked.memberships
    assert token not in ok(ctl(leader, "audit", "--json", "--limit", "500"))


def test_quotas_are_set_listed_and_removed(leader: Leader, tree: dict[str, str]) -> None:
    set_ = ok(
        ctl(leader, "quotas", "set", f"team:{tree['ml']}", "--gpus", "4", "--memory-gb", "64", "--guarantee-gpus", "1")
    )
    assert set_.strip() == f"quota of team:{tree['ml']}: limit 4 gpus, 64 GB; guarantee 1 gpus", set_
    header, found = rows(ok(ctl(leader, "quotas", "ls")))
    assert header == ["SCOPE", "NAME", "GUARANTEE", "LIMIT", "HOLDS", "UPDATED BY", "UPDATED"]
    row = found[f"team:{tree['ml']}"]
    assert row[2:5] == ["1 gpus", "4 gpus, 64 GB", "0 gpus, 0 cpu cores, 0 GB"] and row[5] == actor(), row
    (quota,) = [QuotaView.model_validate(q) for q in json.loads(ok(ctl(leader, "quotas", "ls", "--json")))]
    assert quota.limit is not None and quota.limit.gpus == 4 and quota.limit.cpu_cores is None
    again = QuotaSet.model_validate(
        json.loads(ok(ctl(leader, "quotas", "set", "team:acme/ml", "--cpu-cores", "8", "--json")))
    )
    assert again.scope == f"team:{tree['ml']}"
    assert ctl(leader, "quotas", "set", "team:acme/ml").exit_code == 2  # neither a limit nor a guarantee
    wrong = refused(ctl(leader, "quotas", "set", "org:nosuch", "--gpus", "1"))
    assert "nosuch" in wrong, wrong
    Removed.model_validate(json.loads(ok(ctl(leader, "quotas", "rm", f"team:{tree['ml']}", "--json"))))
    assert not json.loads(ok(ctl(leader, "quotas", "ls", "--json")))


EDITOR = "import sys; open(sys.argv[1], 'a').write('retention:\\n  requests_days: 9\\n')"


def test_settings_are_edited_on_a_base_kept_and_rolled_back(leader: Leader, tmp_path: Path) -> None:
    first = tmp_path / "settings.yaml"
    first.write_text("prices:\n  '*':\n    input_per_million: 1\n    output_per_million: 2\n")
    read = SettingsView.model_validate(json.loads(ok(ctl(leader, "settings", "show", "--json")))).version or 0
    made = ok(ctl(leader, "settings", "edit", "--file", str(first), "--note", "prices", "--base", str(read)))
    version = int(re.match(r"settings version (\d+) by ", made).group(1))  # type: ignore[union-attr]
    assert made.strip().endswith(f": prices (was version {version - 1})"), made
    shown = ctl(leader, "settings", "show")
    assert (
        ok(shown)
        == f"# opod settings version {version}: opod ctl settings edit --file takes this version as its base\n"
        + first.read_text()
    )
    assert f"version {version} by {actor()}" in shown.stderr, shown.stderr

    stale = refused(ctl(leader, "settings", "edit", "--file", str(first), "--base", str(version - 1)))
    assert "(HTTP 409)" in stale and f"the newest is version {version} by {actor()}" in stale, stale
    bad = tmp_path / "bad.yaml"
    bad.write_text("prices:\n  '*':\n    input_per_million: lots\n")
    invalid = refused(ctl(leader, "settings", "edit", "--file", str(bad), "--base", str(version)))
    assert "input_per_million" in invalid and "(HTTP 400)" in invalid, invalid

    edited = ok(ctl(leader, "settings", "edit", "--note", "retention", EDITOR=f'{sys.executable} -c "{EDITOR}"'))
    assert edited.startswith(f"settings version {version + 1} by "), edited
    body = SettingsView.model_validate(json.loads(ok(ctl(leader, "settings", "show", "--json")))).body or ""
    assert "requests_days: 9" in body and "output_per_million: 2" in body
    header, found = rows(ok(ctl(leader, "settings", "history")))
    assert header == ["VERSION", "AT", "BY", "NOTE"] and found[str(version + 1)][-1] == "retention", found
    back = ok(ctl(leader, "settings", "rollback", str(version), "--note", "undo"))
    assert back.startswith(f"settings version {version + 2} by ") and back.strip().endswith(
        f"(the body of version {version})"
    ), back
    earlier = ok(ctl(leader, "settings", "show", "--version", str(version + 1)))
    assert (
        earlier
        == f"# opod settings version {version + 1}: opod ctl settings edit --file takes this version as its base\n"
        + body
    )
    history = [
        SettingsView.model_validate(v)
        for v in json.loads(ok(ctl(leader, "settings", "history", "--limit", "2", "--json")))
    ]
    assert [v.version for v in history] == [version + 2, version + 1]


def test_the_audit_names_who_changed_what(leader: Leader, tree: dict[str, str]) -> None:
    header, _ = rows(ok(ctl(leader, "audit", "--actor", actor(), "--contains", "/api/v1/orgs")))
    assert header == ["AT", "ACTOR", "SOURCE", "ACTION", "TARGET", "STATUS", "DETAIL"]
    events = [
        StoreAuditEvent.model_validate(e) for e in json.loads(ok(ctl(leader, "audit", "--actor", actor(), "--json")))
    ]
    assert any(e.action == "POST /api/v1/orgs" and e.status == 201 and e.actor == actor() for e in events), events
    assert len(json.loads(ok(ctl(leader, "audit", "--limit", "1", "--json")))) == 1
    assert "since" in refused(ctl(leader, "audit", "--since", "lately"))


def test_client_jobs_and_webhook_tests_answer(leader: Leader) -> None:
    assert "no jobs" in ok(ctl(leader, "jobs", "ls", "--status", "expired"))
    missing = refused(ctl(leader, "jobs", "show", "job_nosuch"))
    assert "job_nosuch" in missing and "(HTTP 404)" in missing, missing
    assert [NotifyResult.model_validate(r) for r in json.loads(ok(ctl(leader, "notify", "test", "--json")))] == []
    assert "no webhooks" in ok(ctl(leader, "notify", "test"))


def _served_through_a_project_key(leader: Leader) -> None:
    """Two chat completions with a key of acme/ml/chat."""
    leader.wait_served(MODEL, timeout=90)
    secret = ok(ctl(leader, "keys", "create", "usage", "--project", "acme/ml/chat")).strip()
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)


def test_usage_by_scope_and_its_export_to_csv_and_json(leader: Leader, tree: dict[str, str], tmp_path: Path) -> None:
    _served_through_a_project_key(leader)

    def counted() -> list[ScopeUsageView] | None:
        status, body = leader.admin("GET", "/api/v1/usage?by=project")
        assert status == 200, body
        found = [ScopeUsageView.model_validate(u) for u in body]  # type: ignore[attr-defined]
        return found if any(u.id == tree["chat"] and (u.requests or 0) >= 2 for u in found) else None

    wait_until(counted, 30, "the two requests to show in the project's usage")
    budgeted = tmp_path / "budget.yaml"
    budgeted.write_text(  # as shown: its first line records the version it was made from
        ok(ctl(leader, "settings", "show"))
        + "budgets:\n  - scope: project:acme/ml/chat\n    period: month\n    micros: 1000\n"
    )
    ok(ctl(leader, "settings", "edit", "--file", str(budgeted)))
    header, found = rows(ok(ctl(leader, "usage", "--by", "project")))
    assert header == [
        "SCOPE",
        "NAME",
        "KEYS",
        "REQUESTS",
        "PROMPT",
        "COMPLETION",
        "COST",
        "ERRORS",
        "BUDGET",
        "USED",
        "LAST",
    ]
    chat = found[tree["chat"]]
    assert chat[3] == "2" and chat[8] == "0.001/month" and chat[9].endswith("%"), chat
    spent = [
        u
        for u in (
            ScopeUsageView.model_validate(u) for u in json.loads(ok(ctl(leader, "usage", "--by", "project", "--json")))
        )
        if u.id == tree["chat"]
    ][0]
    assert chat[6] == money(spent.cost_micros) and chat[9] == f"{(spent.fraction or 0) * 100:.1f}%", (chat, spent)
    (org,) = [
        u
        for u in (
            ScopeUsageView.model_validate(u) for u in json.loads(ok(ctl(leader, "usage", "--by", "org", "--json")))
        )
        if u.id == tree["acme"]
    ]
    assert org.requests == 2 and (org.prompt_tokens or 0) > 0
    assert "by" in refused(ctl(leader, "usage", "--by", "planet"))

    csv_file = tmp_path / "usage.csv"
    wrote = ctl(leader, "usage", "export", "--by", "org,project,model", "--period", "month", "--out", str(csv_file))
    ok(wrote)
    with csv_file.open(newline="") as f:
        table = list(csv.DictReader(f))
    assert f"wrote {render.count(len(table), 'row')} (" in wrote.stderr, (table, wrote.stderr)
    mine = [r for r in table if r.get("Model") == MODEL]
    assert len(mine) == 1 and mine[0]["Requests"] == "2", table
    assert (mine[0]["Org"], mine[0]["Project"]) == (tree["acme"], tree["chat"]), mine
    assert int(mine[0]["CostMicros"]) == int(mine[0]["Prompt"]) + 2 * int(mine[0]["Completion"]), (
        mine
    )  # the settings test's prices

    json_file = tmp_path / "usage.json"
    wrote = ctl(leader, "usage", "export", "--format", "json", "--by", "project,model", "--out", str(json_file))
    exported = [StoreExportRow.model_validate(r) for r in json.loads(json_file.read_text())]
    assert f"wrote {render.count(len(exported), 'row')} (" in ok(wrote) + wrote.stderr, wrote.stderr
    assert [r.Requests for r in exported if r.Model == MODEL] == [2], exported
    assert ctl(leader, "usage", "export", "--by", "planet", "--out", str(json_file)).exit_code == 2
    assert not (tmp_path / "usage.json.part").exists() and not (tmp_path / "usage.csv.part").exists()


def _batch(client: openai.OpenAI, lines: int, tag: str) -> str:
    """A batch of chat completions through the openai package; its client job's ID."""
    text = "".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"line {n}"}], "max_tokens": 4},
            }
        )
        + "\n"
        for n in range(lines)
    )
    uploaded = client.files.create(file=(f"{tag}.jsonl", text.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    return batch.id.replace("batch_", "job_", 1)


def test_client_jobs_are_listed_shown_and_cancelled(leader: Leader, tree: dict[str, str]) -> None:
    leader.wait_served(MODEL, timeout=90)
    secret = ok(ctl(leader, "keys", "create", "batches", "--project", "acme/ml/chat")).strip()
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    small = _batch(client, 3, "small")
    big = _batch(client, 200, "big")
    stopped = ok(ctl(leader, "jobs", "cancel", big)).strip()
    assert stopped in (f"{big}: cancelling", f"{big}: cancelled"), stopped

    def ended() -> JobView | None:
        job = JobView.model_validate(json.loads(ok(ctl(leader, "jobs", "show", small, "--json"))))
        return job if job.status == "completed" else None

    done = wait_until(ended, 60, "the small batch to complete")
    assert done.endpoint == "/v1/chat/completions" and done.progress == {
        "total": 3,
        "completed": 3,
        "failed": 0,
        "pending": 0,
    }, done
    header, found = rows(ok(ctl(leader, "jobs", "ls", "--status", "completed")))
    assert header == ["ID", "STATUS", "PROGRESS", "ENDPOINT", "MODEL", "OWNER", "KEY", "CREATED", "ERROR"]
    assert found[small][1:4] == ["completed", "3/3", "/v1/chat/completions"], found
    assert re.search(r"^progress\s+3/3$", ok(ctl(leader, "jobs", "show", small)), re.M)
    listed = [JobView.model_validate(j) for j in json.loads(ok(ctl(leader, "jobs", "ls", "--json")))]
    assert {small, big} <= {j.id for j in listed}


@pytest.mark.parametrize("size", [1, 3, 4096])
def test_an_export_counts_its_rows_across_pieces(size: int) -> None:
    body = json.dumps([{"Project": "a{b}", "Model": 'q"[x', "Requests": 2}, {"Project": "\\", "Requests": 1}]).encode()
    counter = RowCounter(as_json=True)
    for at in range(0, len(body), size):
        counter.feed(body[at : at + size])
    assert counter.rows == 2
    lines = RowCounter(as_json=False)
    text = b"Period,Project\n2026-12-01,a\n2026-12-01,b"
    for at in range(0, len(text), size):
        lines.feed(text[at : at + size])
    lines.finish(text[-size:])
    assert lines.rows == 2
