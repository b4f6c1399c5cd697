"""The ``opod`` command's details as an operator meets them: ids that survive a pipe and a copy, an export to
standard output, settings edited on the version that was read, an audit that cannot drive the terminal, a load
that says what it does, and a rolling restart that says why it waits.

The leader runs in this process (``InProcessLeader``) with one simulator worker declaring an A10G; every
command is the installed ``opod`` in its own process, its output piped as in a script or a log.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from opod.cli.common import print_whole
from opod.cli.ctl import render
from opod.contract.admin.fleet import ReplicaView
from opod.contract.admin.records import SettingsView
from tests.support.gpu_fleet import ONE_A10G
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OPOD, OpodProcess, http, sim_worker, wait_until

NODE = "n_details_with_a_long_node_identifier"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    root = tmp_path_factory.mktemp("ctl-details")
    up = InProcessLeader(root / "home")
    worker: OpodProcess | None = None
    try:
        home = root / "worker"
        home.mkdir()
        (home / "inventory.yaml").write_text(ONE_A10G)
        worker = sim_worker(up, home, NODE, OPOD_INVENTORY=str(home / "inventory.yaml"))
        wait_until(
            lambda: NODE in {n.get("id") for n in up.admin("GET", "/api/v1/nodes")[1] or []}, 60, "the worker to join"
        )
        yield up
    finally:
        if worker is not None:
            worker.stop()
        up.stop()


def opod(
    leader: InProcessLeader, *args: str, columns: str = "", stdin: str | None = None, timeout: float = 90, **env: str
) -> subprocess.CompletedProcess[str]:
    """The installed command, piped; ``columns`` is what ``COLUMNS`` says (empty: nothing, as in a cron job)."""
    environ = {**leader.cli_env(), "COLUMNS": columns, **env}
    return subprocess.run([*OPOD, *args], env=environ, input=stdin, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def whole(value: str, table: str) -> bool:
    """``value`` appears in ``table`` as a cell of its own, on one line, neither cut nor folded."""
    return re.search(rf"(^|\s){re.escape(value)}(\s|$)", table, re.MULTILINE) is not None


def created(leader: InProcessLeader, path: str, body: dict) -> dict:
    status, answer = leader.admin("POST", path, body)
    assert status in (200, 201), answer
    return answer


def test_key_ids_are_whole_in_the_table_at_any_width(leader: InProcessLeader) -> None:
    created(leader, "/api/v1/orgs", {"name": "details"})
    created(leader, "/api/v1/teams", {"name": "platform-engineering", "in": "details"})
    created(leader, "/api/v1/projects", {"name": "chat-assistant-prod", "in": "details/platform-engineering"})
    for name in ("ci", "a key for the nightly evaluation jobs of the chat assistant", "dashboards"):
        created(leader, "/api/v1/keys", {"name": name, "project": "details/platform-engineering/chat-assistant-prod"})
    ids = [k["id"] for k in json.loads(ok(opod(leader, "ctl", "keys", "ls", "--json")))]
    assert len(ids) == 3
    for columns in ("", "60", "80", "160", "200"):
        table = ok(opod(leader, "ctl", "keys", "ls", columns=columns))
        assert all(whole(key_id, table) for key_id in ids), f"COLUMNS={columns!r}:\n{table}"
        assert len([line for line in table.splitlines() if line.strip()]) == 1 + len(ids), "a row is one line piped"


def test_piped_tables_keep_their_ids_whole(leader: InProcessLeader) -> None:
    model = "a-model-whose-name-is-long-enough-to-matter-in-a-pipe"
    ok(opod(leader, "model", "add", model, "--no-load", "--engine", "sim"))
    token = json.loads(ok(opod(leader, "token", "create", "--name", "a token named at some length", "--json")))
    tokens = ok(opod(leader, "token", "ls"))
    assert whole(token["id"], tokens), tokens
    assert whole(model, ok(opod(leader, "model", "ls"))), "the model's name is whole"
    nodes = ok(opod(leader, "node", "ls"))
    assert whole(NODE, nodes), nodes
    assert all(line == line.rstrip() for line in nodes.splitlines()), "no padding after a row's last cell"


def test_at_a_narrow_terminal_ids_stay_whole_and_only_the_wrapping_columns_fold() -> None:
    terminal = io.StringIO()
    shown = Console(file=terminal, width=50, force_terminal=True, color_system=None)
    table = render.table("ID", "PROJECT", "DETAIL", wrap=["DETAIL"])
    key_id, project = "k_" + "0123456789" * 3, "prj_" + "abcdefghij" * 2
    table.add_row(key_id, project, "a detail long enough to fold over several lines of a narrow terminal")
    print_whole(table, shown)
    text = terminal.getvalue()
    assert whole(key_id, text) and whole(project, text), text
    assert len(text.splitlines()) > 2, "the detail folds rather than the ids being cut"


def test_model_load_says_it_loads_the_model_now_and_it_is_served(leader: InProcessLeader) -> None:
    model = "sim-load-now"
    ok(opod(leader, "model", "add", model, "--no-load", "--engine", "sim"))
    states = json.loads(ok(opod(leader, "ctl", "models", "ls", "--json")))
    assert any(m.get("name") == model for m in states)
    said = ok(opod(leader, "model", "load", model))
    assert "on demand" not in said, said
    assert said.strip() == f"{model}: loading it on a worker now, and keeping it loaded (opod model ls shows progress)"
    leader.wait_served(model, timeout=60)
    again = ok(opod(leader, "model", "load", model)).strip()
    assert again == f"{model}: serving on {NODE}; kept loaded on a worker from now on", again
    off = ok(opod(leader, "model", "unload", model)).strip()
    assert off.startswith(f"{model}: unloading it everywhere now"), off
    wait_until(lambda: model not in leader.served(), 30, f"{model} to be unloaded")
    listed = ok(opod(leader, "model", "ls"))
    assert "not loaded (opod model load starts it)" in listed and "on demand" not in listed, listed


def test_usage_export_writes_to_standard_output(leader: InProcessLeader, tmp_path: Path) -> None:
    model = "sim-usage-export"
    ok(opod(leader, "model", "add", model, "--engine", "sim"))
    leader.wait_served(model, timeout=60)
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert http("POST", leader.url + "/v1/chat/completions", chat, key=leader.key)[0] == 200
    into_file = tmp_path / "usage.csv"

    def exported() -> list[list[str]]:
        ok(opod(leader, "ctl", "usage", "export", "--out", str(into_file), "--from", "2020-01-01", "--by", "model"))
        return list(csv.reader(io.StringIO(into_file.read_text())))

    rows = wait_until(lambda: len(found := exported()) > 1 and found, 30, "the request's usage row")
    assert rows[0][:3] == ["Period", "Model", "Requests"] and any(model in row for row in rows[1:]), rows
    for args in ((), ("--out", "-")):
        result = opod(leader, "ctl", "usage", "export", "--from", "2020-01-01", "--by", "model", *args)
        assert ok(result) == into_file.read_text(), result.stderr
        assert "wrote 1 row" in result.stderr and "to standard output" in result.stderr, result.stderr
        assert not Path("-").exists()
    as_json = json.loads(ok(opod(leader, "ctl", "usage", "export", "--format", "json", "--from", "2020-01-01")))
    assert isinstance(as_json, list) and as_json, as_json
    ok(opod(leader, "model", "rm", model))


def test_settings_edit_takes_the_version_that_was_read_as_its_base(leader: InProcessLeader, tmp_path: Path) -> None:
    shown = ok(opod(leader, "ctl", "settings", "show"))
    read = SettingsView.model_validate(json.loads(ok(opod(leader, "ctl", "settings", "show", "--json"))))
    assert shown.startswith(f"# opod settings version {read.version or 0}:"), shown
    mine = tmp_path / "mine.yaml"
    mine.write_text(shown + "retention:\n  requests_days: 5\n")

    theirs = tmp_path / "theirs.yaml"
    theirs.write_text("retention:\n  requests_days: 7\n")
    unsaid = opod(leader, "ctl", "settings", "edit", "--file", str(theirs))
    assert unsaid.returncode == 2 and "--base" in unsaid.stderr, unsaid.stderr
    ok(opod(leader, "ctl", "settings", "edit", "--file", str(theirs), "--base", str(read.version or 0)))

    stale = opod(leader, "ctl", "settings", "edit", "--file", str(mine))
    assert stale.returncode == 1 and "(HTTP 409)" in stale.stderr, stale.stderr
    assert f"the newest is version {(read.version or 0) + 1}" in " ".join(stale.stderr.split()), stale.stderr
    body = SettingsView.model_validate(json.loads(ok(opod(leader, "ctl", "settings", "show", "--json")))).body
    assert body == "retention:\n  requests_days: 7\n", "the change made since was not overwritten"

    fresh = ok(opod(leader, "ctl", "settings", "show"))
    mine.write_text(fresh.replace("requests_days: 7", "requests_days: 5"))
    made = ok(opod(leader, "ctl", "settings", "edit", "--file", str(mine)))
    assert made.startswith(f"settings version {(read.version or 0) + 2} "), made
    body = SettingsView.model_validate(json.loads(ok(opod(leader, "ctl", "settings", "show", "--json")))).body
    assert body == "retention:\n  requests_days: 5\n", "the line recording the base is not part of the body"


def test_the_audit_shows_control_characters_from_a_path_escaped(leader: InProcessLeader) -> None:
    response = leader.request("DELETE", "/api/v1/keys/k_%1b%5b2J%1b%5b31mowned%0dfake")
    assert response.status_code == 404, response.text
    shown = opod(leader, "ctl", "audit", "--contains", "owned")
    table = ok(shown)
    assert "\x1b" not in table and "\r" not in table, repr(table)
    assert "k_\\x1b[2J\\x1b[31mowned\\rfake" in table, table


def test_a_restart_with_no_room_to_surge_says_why_and_the_command_stops_waiting(leader: InProcessLeader) -> None:
    model = "restart-on-the-only-a10g"
    status, body = leader.admin(
        "POST",
        "/api/v1/models",
        {"name": model, "profiles": [{"engine": "sim", "gpu_class": "A10G"}], "scaling": {"min": 1, "max": 1}},
    )
    assert status == 200, body
    leader.wait_served(model, timeout=60)
    started = time.monotonic()
    restart = opod(leader, "ctl", "restart", "--model", model, "--timeout", "5m", "--stuck-after", "3s", timeout=120)
    took = time.monotonic() - started
    assert restart.returncode == 1, f"stdout:\n{restart.stdout}\nstderr:\n{restart.stderr}"
    assert took < 60, f"the command waited {took:.0f} s on a restart that cannot go on"
    said = " ".join(restart.stderr.split())
    assert "still queued for restart after 3 s: restart waits: no node can take its replacement beside it" in said
    assert f"{NODE}: " in said and "--in-place" in said, said
    assert re.search(r"\[0/1\] \S+ queued: restart waits: ", restart.stdout), restart.stdout
    status, rows = leader.admin("GET", f"/api/v1/replicas?model={model}")
    (replica,) = [ReplicaView.model_validate(r) for r in rows]
    assert replica.restart == "queued" and replica.state == "ready"
    assert replica.error and replica.error.startswith("restart waits: "), replica
    assert leader.admin("DELETE", f"/api/v1/models/{model}")[0] == 200
