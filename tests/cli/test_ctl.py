"""``opod ctl`` as an operator runs it: against a real leader with a simulator worker, tables and ``--json``.

Every command is the installed ``opod`` run in its own process, with nothing but the
leader's home (its admin key) and its admin address in the environment, so finding the
token by itself is exercised too. Tables are read the way a person reads them: a header
line, then a row per thing.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.ports import free_port
from opod.cli.ctl.api import refusal
from opod.cli.ctl.render import duration, parse_duration
from opod.contract.admin.catalog import CatalogModel
from opod.contract.admin.fleet import (
    CapacityView,
    CollectResult,
    ExplainView,
    LogsView,
    NodeLabelsView,
    NodeView,
    ReplicaView,
    RestartResult,
    Summary,
)
from opod.contract.admin.models import ModelView, PresetsView, ScaleResponse, TargetView
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OPOD, OpodProcess, clean_env, http, sim_worker, wait_until

NODE = "n_ctl"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    root = tmp_path_factory.mktemp("ctl")
    up = Leader(root / "home")
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(up, root / "worker", NODE)
        wait_until(
            lambda: any(n.get("id") == NODE for n in up.admin("GET", "/api/v1/nodes")[1] or []),
            60,
            "the sim worker to join",
        )
        yield up
    finally:
        if worker is not None:
            worker.stop()
        up.stop()


def ctl(
    leader: Leader, *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    environ = leader.cli_env()
    environ.update(env or {})
    return subprocess.run([*OPOD, "ctl", *args], env=environ, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """A refusal as the operator sees it: exit 1, one ``error:`` line on stderr, no traceback, nothing on stdout."""
    assert result.returncode == 1, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and not result.stdout.strip(), result.stderr + result.stdout
    return result.stderr


def rows(table: str) -> tuple[list[str], dict[str, list[str]]]:
    """A table's header and its rows by first cell (columns split on two or more spaces)."""
    lines = [line for line in table.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0].strip())
    found = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        found[cells[0]] = cells
    return header, found


def json_of(result: subprocess.CompletedProcess[str]) -> object:
    return json.loads(ok(result))


def wait_ready(leader: Leader, model: str) -> list[ReplicaView]:
    def ready() -> list[ReplicaView] | None:
        status, body = leader.admin("GET", f"/api/v1/replicas?model={model}")
        assert status == 200, body
        found = [ReplicaView.model_validate(r) for r in body]
        return found if found and all(r.state == "ready" for r in found) else None

    return wait_until(ready, 60, f"{model}'s replicas to be ready")


def test_summary_table_and_json(leader: Leader) -> None:
    text = ok(ctl(leader, "summary"))
    assert re.search(r"^nodes 1: 1 ready, 0 cordoned, 0 draining, 0 unreachable$", text, re.M), text
    assert re.search(r"^replicas \d+ ready, \d+ starting", text, re.M), text
    view = Summary.model_validate(json_of(ctl(leader, "summary", "--json")))
    assert view.nodes is not None and view.nodes.total == 1 and view.nodes.ready == 1


def test_nodes_table_show_and_json(leader: Leader) -> None:
    header, found = rows(ok(ctl(leader, "nodes", "ls")))
    assert header == [
        "NODE",
        "STATE",
        "HOST",
        "GPUS",
        "CPU",
        "MEMORY",
        "DISK FREE",
        "ENGINES",
        "REPLICAS",
        "SEEN",
        "WARNINGS",
    ]
    assert found[NODE][1] == "ready" and found[NODE][7] == "sim", found[NODE]
    (node,) = [NodeView.model_validate(n) for n in json_of(ctl(leader, "nodes", "ls", "--json"))]  # type: ignore[union-attr]
    assert node.id == NODE and node.engines == ["sim"]
    shown = ok(ctl(leader, "nodes", "show", NODE))
    assert re.search(rf"^node\s+{NODE}$", shown, re.M) and re.search(r"^engines\s+sim$", shown, re.M), shown
    assert NodeView.model_validate(json_of(ctl(leader, "nodes", "show", NODE, "--json"))).id == NODE
    unknown = ctl(leader, "nodes", "show", "no-such-node")
    assert unknown.returncode == 2 and f"the leader knows: {NODE}" in unknown.stderr, unknown.stderr


def test_cordon_label_logs_and_engine_builds_of_a_node(leader: Leader) -> None:
    assert ok(ctl(leader, "nodes", "state", NODE, "cordon")).strip() == f"{NODE}: cordoned"
    assert re.search(r"^nodes 1: 0 ready, 1 cordoned", ok(ctl(leader, "summary")), re.M)
    wrong = refused(ctl(leader, "nodes", "state", NODE, "asleep"))
    assert wrong.startswith("error: state: ") and "(HTTP 400)" in wrong, wrong
    assert ok(ctl(leader, "nodes", "state", NODE, "ready")).strip() == f"{NODE}: ready"

    labelled = ok(ctl(leader, "nodes", "labels", NODE, "--set", "llmgw.io/rack=r7", "--set", "team=ml"))
    assert re.search(r"^operator labels\s+llmgw.io/rack=r7, team=ml$", labelled, re.M) and re.search(
        r"^location\s+rack=r7$", labelled, re.M
    ), labelled
    view = NodeLabelsView.model_validate(json_of(ctl(leader, "nodes", "labels", NODE, "--remove", "team", "--json")))
    assert view.operator_labels == {"llmgw.io/rack": "r7"}
    bad = ctl(leader, "nodes", "labels", NODE, "--set", "team")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr, bad.stderr

    logs = ctl(leader, "nodes", "logs", NODE, "-n", "2")
    assert 1 <= len(ok(logs).splitlines()) <= 2 and "sources: agent" in logs.stderr, logs.stdout + logs.stderr
    assert LogsView.model_validate(json_of(ctl(leader, "nodes", "logs", NODE, "--json"))).node == NODE
    assert ok(ctl(leader, "nodes", "engines", NODE, "sim", "--build", "auto")).strip() == f"{NODE}: sim build auto"
    gone = refused(ctl(leader, "nodes", "rm", NODE))
    assert "stop its worker first" in gone and "(HTTP 409)" in gone, gone


def test_explain_headroom_target_and_capacity(leader: Leader, tmp_path: Path) -> None:
    ok(ctl(leader, "models", "add", "ctl-place", "--engine", "sim", "--min", "1", "--max", "1"))
    wait_ready(leader, "ctl-place")
    assert ok(ctl(leader, "explain", "ctl-place")).strip() == "ctl-place: placed"
    big = tmp_path / "big.yaml"
    big.write_text("name: ctl-big\nprofiles:\n  - engine: sim\n    min_memory_gb: 100000\n")
    ok(ctl(leader, "models", "add", "--file", str(big)))

    def rejected() -> ExplainView | None:
        view = ExplainView.model_validate(json_of(ctl(leader, "explain", "ctl-big", "--json")))
        return view if view.rejections else None

    assert wait_until(rejected, 30, "ctl-big to be rejected").placed is False
    text = ok(ctl(leader, "explain", "ctl-big"))
    assert text.splitlines()[0] == "ctl-big: not placed"
    header, found = rows("\n".join(text.splitlines()[1:]))
    assert header == ["NODE", "PROFILE", "POOL", "WHY NOT"] and "min_memory_gb" in found[NODE][3], text
    ok(ctl(leader, "models", "rm", "ctl-big"))

    assert re.search(r"^replicas now\s+1$", ok(ctl(leader, "models", "headroom", "ctl-place")), re.M)
    unmeasured = refused(ctl(leader, "models", "target", "ctl-place", "--tokens-per-sec", "500"))
    assert "no measured capacity" in unmeasured and "(HTTP 400)" in unmeasured, unmeasured
    put = ok(
        ctl(
            leader,
            "models",
            "capacity",
            "put",
            "ctl-place",
            "--max-concurrency",
            "4",
            "--throughput",
            "120",
            "--ttft-p99",
            "350ms",
        )
    )
    assert "4 concurrent within the SLO, 120 tokens/s" in put, put
    header, found = rows(ok(ctl(leader, "models", "capacity", "ls")))
    assert header[:5] == ["MODEL", "PROFILE", "CONCURRENCY", "TOKENS/S", "TTFT P99"] and found["ctl-place"][2:5] == [
        "4",
        "120",
        "350ms",
    ]
    measured = [CapacityView.model_validate(c) for c in json_of(ctl(leader, "models", "capacity", "ls", "--json"))]  # type: ignore[union-attr]
    assert any(c.model == "ctl-place" and c.ttft_p99 == 350_000_000 for c in measured)
    assert re.search(
        r"^replicas needed\s+5$", ok(ctl(leader, "models", "target", "ctl-place", "--tokens-per-sec", "500")), re.M
    )
    target = TargetView.model_validate(
        json_of(ctl(leader, "models", "target", "ctl-place", "--tokens-per-sec", "500", "--json"))
    )
    assert target.needed == 5 and target.current == 1
    ok(ctl(leader, "models", "rm", "ctl-place"))


def test_add_a_model_from_flags_list_show_and_remove(leader: Leader) -> None:
    assert ok(
        ctl(
            leader,
            "models",
            "add",
            "ctl-flags",
            "--engine",
            "sim",
            "--alias",
            "flags-alias",
            "--min",
            "1",
            "--max",
            "2",
            "--description",
            "added from flags",
        )
    ).startswith("added ctl-flags")
    wait_ready(leader, "ctl-flags")
    header, found = rows(ok(ctl(leader, "models", "ls")))
    assert header == ["MODEL", "CLASS", "READY", "MIN-MAX", "PROFILES", "OWNER", "STATE"]
    row = found["ctl-flags (flags-alias)"]
    assert row[1:] == ["standard", "1/1", "1-2", "sim", "shared", "ok"], row

    listed = [ModelView.model_validate(m) for m in json_of(ctl(leader, "models", "ls", "--json"))]  # type: ignore[union-attr]
    mine = next(m for m in listed if m.name == "ctl-flags")
    assert mine.aliases == ["flags-alias"] and mine.min_replicas == 1 and mine.max_replicas == 2

    shown = ok(ctl(leader, "models", "show", "ctl-flags"))
    assert re.search(r"^description\s+added from flags$", shown, re.M) and re.search(
        r"^scaling\s+1 to 2$", shown, re.M
    ), shown
    assert re.search(r"^PROFILE\s+ENGINE\s+GPUS", shown, re.M) and re.search(r"^\S+\s+sim\s+cpu\s+1×1", shown, re.M), (
        shown
    )
    entry = CatalogModel.model_validate(json_of(ctl(leader, "models", "show", "ctl-flags", "--json")))
    assert entry.name == "ctl-flags" and entry.profiles and entry.profiles[0].engine == "sim"

    again = refused(ctl(leader, "models", "add", "ctl-flags", "--engine", "sim"))
    assert "already in the catalog" in again and "(HTTP 409)" in again, again

    assert ok(ctl(leader, "models", "rm", "ctl-flags")).strip() == "removed ctl-flags"
    assert "ctl-flags" not in ok(ctl(leader, "models", "ls"))
    assert "(HTTP 404)" in refused(ctl(leader, "models", "show", "ctl-flags"))


def test_add_a_model_from_a_yaml_file(leader: Leader, tmp_path: Path) -> None:
    file = tmp_path / "model.yaml"
    file.write_text(
        "name: ctl-file\ndescription: from a file\nprofiles:\n  - engine: sim\nscaling: {min: 1, max: 1}\nclass: critical\n"
    )
    assert ok(ctl(leader, "models", "add", "--file", str(file))).startswith("added ctl-file")
    entry = CatalogModel.model_validate(json_of(ctl(leader, "models", "show", "ctl-file", "--json")))
    assert entry.description == "from a file" and entry.class_ == "critical"
    ok(ctl(leader, "models", "rm", "ctl-file"))


def test_a_file_that_is_not_a_catalog_model_is_refused_before_anything_is_sent(leader: Leader, tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text("name: ctl-bad\nprofiles:\n  - engine: sim\n    gpu_clas: H100\nscaling: {min: lots}\n")
    message = refused(ctl(leader, "models", "add", "--file", str(file)))
    assert "profiles.0.gpu_clas: Extra inputs are not permitted" in message and "scaling.min" in message, message
    assert "ctl-bad" not in ok(ctl(leader, "models", "ls"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = ctl(leader, "models", "add", "--file", str(broken))
    assert result.returncode == 2 and "is not valid JSON" in result.stderr, result.stderr


def test_scale_class_owner_retry_and_resources(leader: Leader) -> None:
    ok(ctl(leader, "models", "add", "ctl-knobs", "--engine", "sim", "--min", "1", "--max", "1"))
    assert (
        ok(ctl(leader, "models", "scale", "ctl-knobs", "--min", "0", "--max", "2", "--idle-timeout", "10m")).strip()
        == "ctl-knobs: 0 to 2 replicas, on demand (stopped after 10m0s idle)"
    )
    scaled = ScaleResponse.model_validate(json_of(ctl(leader, "models", "scale", "ctl-knobs", "--max", "3", "--json")))
    assert scaled.max == 3 and scaled.idle_timeout == 600_000_000_000
    bad = ctl(leader, "models", "scale", "ctl-knobs", "--idle-timeout", "ten minutes")
    assert bad.returncode == 2 and "--idle-timeout" in bad.stderr and "90s, 10m, 1h30m" in bad.stderr, bad.stderr

    assert ok(ctl(leader, "models", "class", "ctl-knobs", "opportunistic")).strip() == "ctl-knobs: class opportunistic"
    wrong = refused(ctl(leader, "models", "class", "ctl-knobs", "urgent"))
    assert "class" in wrong and "(HTTP 400)" in wrong, wrong
    assert ok(ctl(leader, "models", "owner", "ctl-knobs")).strip() == "ctl-knobs: shared"
    assert ok(ctl(leader, "models", "retry", "ctl-knobs")).strip() == "ctl-knobs was not parked; nothing to retry"
    ok(ctl(leader, "models", "add", "ctl-spare", "--engine", "sim", "--min", "0"))
    said = ok(ctl(leader, "models", "fallbacks", "ctl-knobs", "ctl-spare"))
    assert said.strip() == "ctl-knobs: falls back to ctl-spare"
    cycle = refused(ctl(leader, "models", "fallbacks", "ctl-spare", "ctl-knobs"))
    assert "cycle" in cycle and "(HTTP 400)" in cycle, cycle
    assert ok(ctl(leader, "models", "fallbacks", "ctl-knobs")).strip() == "ctl-knobs: no fallbacks"
    assert json_of(ctl(leader, "models", "retry", "ctl-knobs", "--json")) == {"was_parked": False}
    assert "2 GiB host memory, 1 CPU cores" in ok(
        ctl(leader, "models", "resources", "ctl-knobs", "--memory-gb", "2", "--cpu-cores", "1")
    )
    ok(ctl(leader, "models", "rm", "ctl-knobs"))


def test_replicas_table_and_json(leader: Leader) -> None:
    ok(ctl(leader, "models", "add", "ctl-replicas", "--engine", "sim", "--min", "1", "--max", "1"))
    (replica,) = wait_ready(leader, "ctl-replicas")
    header, found = rows(ok(ctl(leader, "replicas", "--model", "ctl-replicas")))
    assert header[:5] == ["REPLICA", "MODEL", "PROFILE", "STATE", "NODES"]
    assert found[replica.id or ""][1] == "ctl-replicas" and found[replica.id or ""][3] == "ready"
    assert f"{NODE} (ready)" in found[replica.id or ""][4]
    listed = [
        ReplicaView.model_validate(r) for r in json_of(ctl(leader, "replicas", "--model", "ctl-replicas", "--json"))
    ]  # type: ignore[union-attr]
    assert [r.id for r in listed] == [replica.id]
    ok(ctl(leader, "models", "rm", "ctl-replicas"))


def test_restart_is_queued_and_followed_until_replaced_or_its_timeout(leader: Leader) -> None:
    ok(ctl(leader, "models", "add", "ctl-restart", "--engine", "sim", "--min", "1", "--max", "1"))
    (replica,) = wait_ready(leader, "ctl-restart")
    result = RestartResult.model_validate(
        json_of(ctl(leader, "restart", "--model", "ctl-restart", "--no-wait", "--json"))
    )
    assert result.queued == [replica.id]
    followed = ctl(leader, "restart", replica.id or "", "--max-surge", "1", "--timeout", "2s")
    assert followed.stdout.startswith(f"queued 1 replica for restart: {replica.id}\n"), followed.stdout
    lines = followed.stdout.splitlines()[1:]
    if followed.returncode == 0:  # the reconciler replaced it within the two seconds
        assert lines[-1].startswith("done: 1 replica restarted") and f"[1/1] {replica.id}" in followed.stdout, (
            followed.stdout
        )
    else:
        assert any(  # queued, with why it waits when it does (one node cannot hold two replicas of a model)
            line == f"[0/1] {replica.id} replacing" or re.fullmatch(rf"\[0/1\] {replica.id} queued(: .+)?", line)
            for line in lines
        ), followed.stdout
        assert (
            "after --timeout 2s, 1 replica not yet restarted" in followed.stderr
            and "the restart goes on" in followed.stderr
        ), followed.stderr
    in_place = ctl(
        leader, "restart", "--model", "ctl-restart", "--in-place", "--max-unavailable", "1", "--timeout", "60s"
    )
    queued = RestartResult.model_validate(
        json_of(ctl(leader, "restart", "--model", "ctl-restart", "--no-wait", "--json"))
    ).queued
    lines = ok(in_place).splitlines()
    assert (
        lines[0].startswith("queued 1 replica for restart: ")
        and lines[-1] == "done: 1 replica restarted; ctl-restart 1 ready"
    ), lines
    assert re.fullmatch(
        r"\[1/1\] \S+ (replaced|restarted in place)", next(line for line in lines if line.startswith("[1/1]"))
    ), lines
    assert queued and queued[0] not in lines[0], (
        "the replica the in-place restart queued has been replaced by a new one"
    )
    usage = ctl(leader, "restart")
    assert usage.returncode == 2 and "--model MODEL, or --all" in usage.stderr, usage.stderr
    ok(ctl(leader, "models", "rm", "ctl-restart"))


def test_presets_list_auto_and_add(leader: Leader) -> None:
    text = ok(ctl(leader, "presets", "ls"))
    assert text.splitlines()[0].startswith("auto-add: ")
    header, found = rows("\n".join(text.splitlines()[1:]))
    assert header[:5] == ["PRESET", "MAKES", "FITS", "GPU CLASSES", "IN CATALOG"]
    view = PresetsView.model_validate(json_of(ctl(leader, "presets", "ls", "--json")))
    names = {p.name for p in view.presets or []}
    assert "smollm2-135m-instruct" in names and set(found) == names
    assert ok(ctl(leader, "presets", "auto", "off")).startswith("auto-add: off; ")
    assert PresetsView.model_validate(json_of(ctl(leader, "presets", "auto", "off", "--json"))).auto is False
    usage = ctl(leader, "presets", "auto", "maybe")
    assert usage.returncode == 2 and "say on or off" in usage.stderr, usage.stderr
    assert "(HTTP 404)" in refused(ctl(leader, "presets", "add", "no-such-preset"))


def test_weights_orphans_and_collect(leader: Leader) -> None:
    text = ok(ctl(leader, "weights", "orphans"))
    assert text.splitlines()[0].split() == ["NODE", "SIZE", "PATHS"]
    assert isinstance(json_of(ctl(leader, "weights", "orphans", "--json")), list)
    collected = ok(ctl(leader, "weights", "collect", "--node", NODE))
    assert (
        re.search(rf"^\[1/1\] {NODE}: \d+ files, .+ freed$", collected, re.M) and "freed" in collected.splitlines()[-1]
    ), collected
    results = [
        CollectResult.model_validate(r) for r in json_of(ctl(leader, "weights", "collect", "--node", NODE, "--json"))
    ]  # type: ignore[union-attr]
    assert [r.node for r in results] == [NODE]


def test_a_change_is_recorded_as_made_by_the_login_name(leader: Leader) -> None:
    ok(ctl(leader, "presets", "auto", "off"))
    login = re.sub(r"[^A-Za-z0-9._@-]", "_", pwd.getpwuid(os.getuid()).pw_name)[:64] or "unknown"

    def actors() -> set[str] | None:
        status, _, body = http("GET", leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=leader.key)
        assert status == 200 and isinstance(body, dict), body
        found = {
            str((e.get("data") or {}).get("actor")) for e in body.get("events") or [] if e.get("type") == "admin.call"
        }
        return found if login in found else None

    assert login in wait_until(actors, 10, f"an admin.call event by {login}")


def test_refusals_name_the_reason_and_exit_nonzero(leader: Leader) -> None:
    missing = refused(ctl(leader, "explain", "no-such-model"))
    assert "(HTTP 404)" in missing, missing
    unknown_node = refused(ctl(leader, "nodes", "state", "no-such-node", "cordon"))
    assert "(HTTP 404)" in unknown_node, unknown_node
    wrong_key = refused(ctl(leader, "summary", env={"OPOD_ADMIN_KEY": "not-the-key"}))
    assert "(HTTP 401: the admin key was refused" in wrong_key, wrong_key
    nobody = refused(ctl(leader, "summary", env={"OPOD_ADMIN_URL": f"http://127.0.0.1:{free_port()}"}))
    assert "cannot reach the leader's admin API" in nobody and "OPOD_ADMIN_URL" in nobody, nobody


def test_no_key_anywhere_says_where_it_looked(tmp_path: Path) -> None:
    result = subprocess.run(
        [*OPOD, "ctl", "summary"],
        env=clean_env(tmp_path / "empty", OPOD_ADMIN_URL=f"http://127.0.0.1:{free_port()}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "no admin key" in result.stderr and "OPOD_ADMIN_KEY" in result.stderr, (
        result.stderr
    )


def test_a_501_says_the_area_is_not_built() -> None:
    body = json.dumps({"error": "this opod does not have the management API's fabrics yet"})
    line = refusal("GET", "/api/v1/fabrics", 501, body)
    assert (
        line.startswith("this opod does not have the management API's fabrics yet (HTTP 501: ") and "not built" in line
    )
    assert refusal("GET", "/x", 502, "<html>bad gateway</html>") == "<html>bad gateway</html> (HTTP 502)"


def test_durations_are_written_and_read_as_go_does() -> None:
    assert [duration(n) for n in (0, 250_000_000, 1_500_000_000, 600_000_000_000, 5_400_000_000_000)] == [
        "0s",
        "250ms",
        "1.5s",
        "10m0s",
        "1h30m0s",
    ]
    assert [parse_duration(t, "--x") for t in ("0", "90s", "10m", "1h30m", "250ms")] == [
        0,
        90_000_000_000,
        600_000_000_000,
        5_400_000_000_000,
        250_000_000,
    ]


def test_the_leader_is_found_from_its_admin_listen_setting(leader: Leader) -> None:
    environ = clean_env(leader.home, OPOD_ADMIN_LISTEN=f"0.0.0.0:{leader.admin_port}")
    result = subprocess.run([*OPOD, "ctl", "summary"], env=environ, capture_output=True, text=True, timeout=60)
    assert re.search(r"^nodes 1: ", ok(result), re.M)


def boot_id(leader: Leader) -> str:
    """The boot id the leader holds for the worker; a new process brings a new one."""
    status, _, body = http("GET", f"{leader.url}/admin/v1/nodes", key=leader.key)
    assert status == 200, body
    return next(n["boot_id"] for n in body if n["id"] == NODE)  # type: ignore[union-attr]


def test_upgrade_and_agent_restart_last(leader: Leader) -> None:
    """Last in the module: the agent starts over, so the node re-registers."""
    assert ok(ctl(leader, "nodes", "upgrade", NODE, "0.2.0")).strip() == f"{NODE}: upgrading to 0.2.0"
    assert "version" in refused(ctl(leader, "nodes", "upgrade", NODE, "latest!"))
    first_boot = boot_id(leader)
    assert ok(ctl(leader, "agents", "restart")).strip() == f"restarting the agents of 1 node: {NODE}"
    # The node stays ready while the new process starts: wait for the new process itself, so the module's
    # teardown does not interrupt it half-way through its imports (where Python drops a Ctrl-C).
    wait_until(lambda: boot_id(leader) != first_boot, 60, "the worker's new boot id")
    wait_until(
        lambda: re.search(r"^nodes 1: 1 ready", ok(ctl(leader, "summary")), re.M), 60, "the node to be ready again"
    )
