"""The fleet through the management API: a leader with two simulator workers declaring GPU fleets.

One worker declares 8×H100 (one unhealthy) with its rack; the other an A100 split
into MIG instances. What an operator sees in ``GET /api/v1/nodes``, and what
state, labels, logs, engines, upgrade, delete and agents/restart do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gpu_fleet import nodes
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, opod_cli, sim_worker, wait_until

H100_BOX = """
gpus:
  - {name: NVIDIA H100 80GB HBM3, class: H100-80GB, memory_gb: 80, compute_capability: "9.0", count: 8}
unhealthy: {"7": "XID 79: fell off the bus"}
labels: {llmgw.io/site: par1, llmgw.io/rack: r12, llmgw.io/pdu: "pdu-a,pdu-b"}
cpu_cores: 96
memory_gb: 1024
"""
MIG_BOX = """
gpus:
  - name: NVIDIA A100-SXM4-80GB
    class: A100-80GB
    memory_gb: 80
    compute_capability: "8.0"
    mig: [{profile: 3g.40gb, memory_gb: 40}, {profile: 2g.20gb, memory_gb: 20, count: 2}]
labels: {llmgw.io/site: par1}
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Leader, dict[str, OpodProcess], Path]]:
    root = tmp_path_factory.mktemp("fleet")
    leader = Leader(root / "leader")
    workers = {}
    for name, text in (("n_h100", H100_BOX), ("n_mig", MIG_BOX)):
        (root / f"{name}.yaml").write_text(text)
        workers[name] = sim_worker(leader, root / name, name, OPOD_INVENTORY=str(root / f"{name}.yaml"))
    for worker in workers.values():
        worker.wait_for_line("registered with", timeout=30)
    yield leader, workers, root
    for worker in workers.values():
        worker.stop()
    leader.stop()


def test_the_declared_gpus_show_by_class_with_free_unhealthy_and_mig(fleet) -> None:
    leader, _, _ = fleet
    h100, mig = nodes(leader)["n_h100"], nodes(leader)["n_mig"]
    assert h100["state"] == "ready" and h100["cpu_count"] == 96 and h100["memory_gb"] == 1024
    assert (h100["gpu_total"], h100["gpu_free"]) == (8, 7)
    assert h100["gpus_by_class"] == [{"class": "H100-80GB", "total": 8, "free": 7, "unhealthy": 1, "mig": False}]
    assert h100["unhealthy_gpus"] == ["7: XID 79: fell off the bus"]
    assert h100["compute_capabilities"] == ["9.0"] and h100["gpu_classes"] == ["H100-80GB"]
    assert h100["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "label": "0",
        "class": "H100-80GB",
        "card": 0,
        "memory_total_mb": 81920,
        "compute_capability": "9.0",
    }
    assert h100["location"] == {"site": "par1", "rack": "r12", "pdus": ["pdu-a", "pdu-b"]}
    assert h100["labels"]["llmgw.io/rack"] == "r12" and "operator_labels" not in h100
    assert h100["engines"] == ["sim"] and h100["engine_versions"]["sim"] == h100["agent_version"]
    assert "logs" in h100["features"] and h100["models_on_disk"] == [] and h100["replicas"] == 0
    assert h100["last_seen_ago"].endswith("s") and "null" not in str(h100)
    assert [g["label"] for g in mig["gpus"]] == ["0/mig0", "0/mig1", "0/mig2"]
    assert mig["gpus_by_class"] == [
        {"class": "A100-80GB/3g.40gb", "total": 1, "free": 1, "unhealthy": 0, "mig": True},
        {"class": "A100-80GB/2g.20gb", "total": 2, "free": 2, "unhealthy": 0, "mig": True},
    ]
    assert mig["gpus"][0]["mig_profile"] == "3g.40gb" and mig["gpus"][0]["memory_total_mb"] == 40 * 1024


def test_cordon_drain_and_ready_and_the_admin_v1_drain_is_the_same_state(fleet) -> None:
    leader, _, _ = fleet
    for word, state in (("cordon", "cordoned"), ("drain", "draining"), ("uncordon", "ready"), ("cordoned", "cordoned")):
        status, body = leader.admin("POST", "/api/v1/nodes/n_mig/state", {"state": word})
        assert (status, body) == (200, {"id": "n_mig", "state": state})
        assert nodes(leader)["n_mig"]["state"] == state
    status, _, body = http("POST", leader.url + "/admin/v1/nodes/n_mig/drain", {}, key=leader.key)
    assert status == 200 and nodes(leader)["n_mig"]["state"] == "draining"
    http("POST", leader.url + "/admin/v1/nodes/n_mig/undrain", {}, key=leader.key)
    assert nodes(leader)["n_mig"]["state"] == "ready"
    status, body = leader.admin("POST", "/api/v1/nodes/n_mig/state", {"state": "asleep"})
    assert status == 400 and body["error"].startswith("state: 'asleep' is not a node state")
    status, body = leader.admin("POST", "/api/v1/nodes/n_nope/state", {"state": "drain"})
    assert status == 404 and "n_nope" in body["error"]


def test_operator_labels_over_the_workers_own_and_the_location_they_give(fleet) -> None:
    leader, _, _ = fleet
    status, body = leader.admin(
        "POST", "/api/v1/nodes/n_mig/labels", {"set": {"llmgw.io/rack": "r7", "team": "search"}}
    )
    assert status == 200, body
    assert body["operator_labels"] == {"llmgw.io/rack": "r7", "team": "search"}
    assert body["labels"] == {"llmgw.io/site": "par1", "llmgw.io/rack": "r7", "team": "search"}
    assert body["location"] == {"site": "par1", "rack": "r7"}
    status, body = leader.admin("POST", "/api/v1/nodes/n_mig/labels", {"remove": ["team"]})
    assert body["operator_labels"] == {"llmgw.io/rack": "r7"} and nodes(leader)["n_mig"]["location"]["rack"] == "r7"
    status, body = leader.admin("POST", "/api/v1/nodes/n_mig/labels", {"set": {"bad key": "x"}})
    assert status == 400 and body["error"].startswith("set: label key 'bad key'")
    assert nodes(leader)["n_mig"]["operator_labels"] == {"llmgw.io/rack": "r7"}, (
        "a refused change leaves nothing half-applied"
    )
    status, body = leader.admin("POST", "/api/v1/nodes/n_mig/labels", {"set": {"a": "1"}, "remove": ["a"]})
    assert status == 400 and body["error"].startswith("remove: 'a' is also in set")


def test_logs_of_the_agent_with_lines_and_source_checked(fleet) -> None:
    leader, _, _ = fleet
    status, body = leader.admin("GET", "/api/v1/nodes/n_h100/logs?lines=50")
    assert status == 200, body
    assert body["node"] == "n_h100" and body["source"] == "agent" and body["sources"] == ["agent"]
    assert any("registered with" in line for line in body["lines"]) and len(body["lines"]) <= 50
    status, body = leader.admin("GET", "/api/v1/nodes/n_h100/logs?source=nope")
    assert status == 400 and body["error"] == "source: node n_h100 has no log 'nope'; it has agent"
    status, body = leader.admin("GET", "/api/v1/nodes/n_h100/logs?lines=5000")
    assert status == 400 and body["error"].startswith("lines: 5000 is out of range")


def test_engine_builds_and_the_wanted_release_are_recorded_and_shown(fleet) -> None:
    leader, _, _ = fleet
    # A build the worker carries out without a download (a vLLM build would be pip-installed).
    status, body = leader.admin("POST", "/api/v1/nodes/n_h100/engines", {"engine": "llamacpp", "build": "portable"})
    assert (status, body) == (200, {"engine": "llamacpp", "build": "portable"})
    assert nodes(leader)["n_h100"]["engine_builds"] == {"llamacpp": "portable"}
    status, body = leader.admin("POST", "/api/v1/nodes/n_h100/engines", {"engine": "tensorflow"})
    assert status == 400 and body["error"].startswith("engine: 'tensorflow' is not an engine opod runs")
    status, body = leader.admin("POST", "/api/v1/nodes/n_h100/upgrade", {"version": "9.9.9"})
    assert (status, body) == (200, {"node": "n_h100", "version": "9.9.9"})
    assert any("release 9.9.9 is wanted" in w for w in nodes(leader)["n_h100"]["warnings"])
    status, body = leader.admin("POST", "/api/v1/nodes/n_h100/upgrade", {})
    assert status == 400 and body["error"].startswith("version:")


def test_a_reachable_node_is_not_forgotten(fleet) -> None:
    leader, _, _ = fleet
    status, body = leader.admin("DELETE", "/api/v1/nodes/n_h100")
    assert status == 409 and "is reachable (it heartbeats)" in body["error"]
    assert leader.admin("DELETE", "/api/v1/nodes/n_nope")[0] == 404


def test_agents_restart_reads_the_inventory_again_and_registers_anew(fleet) -> None:
    leader, workers, root = fleet
    (root / "n_mig.yaml").write_text(MIG_BOX.replace("llmgw.io/site: par1", "llmgw.io/site: ams2"))
    status, body = leader.admin("POST", "/api/v1/agents/restart", {})
    assert status == 200 and sorted(body["nodes"]) == ["n_h100", "n_mig"], body
    wait_until(
        lambda: nodes(leader)["n_mig"]["labels"]["llmgw.io/site"] == "ams2", 20, "the restarted agent's new labels"
    )
    assert workers["n_mig"].proc.poll() is None, "the worker process kept running"
    assert nodes(leader)["n_mig"]["state"] in ("ready", "cordoned", "draining")


def test_opod_node_ls_shows_gpus_by_class_and_state(fleet) -> None:
    leader, _, _ = fleet
    table = opod_cli(leader, "node", "ls")
    assert table.returncode == 0, table.stderr
    line = next(line for line in table.stdout.splitlines() if line.startswith("n_h100"))
    assert "8× H100-80GB (80 GiB, 7 free, 1 unhealthy)" in line, table.stdout
    listed = opod_cli(leader, "node", "state", "n_mig", "cordon")
    assert listed.returncode == 0 and "n_mig: cordoned" in listed.stdout
    opod_cli(leader, "node", "state", "n_mig", "ready")
    logs = opod_cli(leader, "node", "logs", "n_h100", "-n", "5")
    assert logs.returncode == 0 and 0 < len(logs.stdout.splitlines()) <= 5


def test_load_is_the_real_hosts_as_its_last_heartbeat_said_and_provision_says_what_can_run(fleet) -> None:
    leader, _, _ = fleet
    # CPU use is measured between two heartbeats: the second one brings it.
    h100 = wait_until(
        lambda: (n := nodes(leader)["n_h100"])["load"].get("cpu_percent") is not None and n, 20, "a CPU use"
    )
    load = h100["load"]
    assert 0 <= load["cpu_percent"] <= 100 and all(load[k] >= 0 for k in ("load1", "load5", "load15"))
    # The declared inventory says 96 cores and 1 TiB; the load is this machine's.
    assert load["cpus"] == os.cpu_count() and h100["cpu_count"] == 96
    assert 0 < load["memory_used_bytes"] < load["memory_total_bytes"] < 1024 << 30
    assert 0 < load["memory_percent"] < 100 and 0 <= load["age_seconds"] <= 10
    assert "gpu_sensors" not in load  # declared GPUs are not sensed
    provision = {p["engine"]: p for p in h100["provision"]}
    assert provision["sim"]["state"] == "ready" and provision["sim"]["version"] == h100["agent_version"]
    assert provision["vllm"]["state"] == "unsupported" and provision["vllm"]["detail"].startswith(
        ("not installed", "no GPU")
    )
    assert provision["llamacpp"]["state"] == "ready" and provision["llamacpp"]["version"]
    assert "null" not in str(h100)


def test_state_and_operator_labels_are_kept_across_a_leader_restart(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader")
    (tmp_path / "inv.yaml").write_text(MIG_BOX)
    worker = sim_worker(leader, tmp_path / "w", "n_kept", OPOD_INVENTORY=str(tmp_path / "inv.yaml"))
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert leader.admin("POST", "/api/v1/nodes/n_kept/state", {"state": "cordon"})[0] == 200
        assert leader.admin("POST", "/api/v1/nodes/n_kept/labels", {"set": {"llmgw.io/row": "b"}})[0] == 200
        leader = leader.restart()
        node = nodes(leader)["n_kept"]
        assert node["operator_labels"] == {"llmgw.io/row": "b"} and node["gpu_total"] == 3, node
        wait_until(lambda: nodes(leader)["n_kept"]["state"] == "cordoned", 30, "the worker to heartbeat the new leader")
        assert nodes(leader)["n_kept"]["location"] == {"site": "par1", "row": "b"}
    finally:
        worker.stop()
        leader.stop()
