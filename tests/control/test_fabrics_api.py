"""Fabrics and NVLink through the management API: a leader with simulator workers declaring how they are wired.

Three nodes on fabric ib-a (one of them with an adapter down), one on ib-b. What ``GET
/api/v1/nodes`` and the summary's ``fabrics`` show, where a two-node replica lands and why
the others were refused, and which cards tensor parallel on one node takes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gpu_fleet import add, nodes, replicas
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker, wait_until

H100 = "{name: NVIDIA H100 80GB HBM3, class: H100, memory_gb: 80, compute_capability: '9.0'"
BOXES = {
    # Cards 0 and 2 are NVLink peers, and 1 and 3: tensor parallel over two should take one of those pairs.
    "n_ib1": f"""
gpus:
  - {H100}, nvlink_peers: [2]}}
  - {H100}, nvlink_peers: [3]}}
  - {H100}, count: 2}}
nvlink_domain: nvl-a
fabrics: [{{name: ib-a, adapters: [mlx5_0, mlx5_1]}}]
""",
    "n_ib2": f"gpus: [{H100}}}]\nfabrics: [{{name: ib-a, adapters: [mlx5_0]}}]\n",
    "n_ibb": f"gpus: [{H100}}}]\nfabrics: [{{name: ib-b, adapters: [mlx5_0]}}]\n",
    "n_down": f"gpus: [{H100}}}]\nfabrics: [{{name: ib-a, adapters: [mlx5_0, {{name: mlx5_1, state: down}}]}}]\n",
}
TWO_NODES = {"engine": "sim", "gpu_class": "H100", "tp": 2, "gpus_per_node": 1, "nodes": 2}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    root = tmp_path_factory.mktemp("fabrics")
    leader = Leader(root / "leader")
    workers: list[OpodProcess] = []
    for name, text in BOXES.items():
        (root / f"{name}.yaml").write_text(text)
        workers.append(sim_worker(leader, root / name, name, OPOD_INVENTORY=str(root / f"{name}.yaml")))
    for worker in workers:
        worker.wait_for_line("registered with", timeout=30)
    yield leader
    for worker in workers:
        worker.stop()
    leader.stop()


def fabric_use(leader: Leader) -> dict[str, dict]:
    status, body = leader.admin("GET", "/api/v1/summary")
    assert status == 200, body
    return {f["fabric"]: f for f in body["fabrics"]}


def test_the_node_views_show_fabrics_multi_node_and_nvlink(fleet: Leader) -> None:
    seen = nodes(fleet)
    ib1, down = seen["n_ib1"], seen["n_down"]
    assert ib1["fabrics"] == ["ib-a"] and ib1["multi_node"] == "ready" and ib1["nvlink_domain"] == "nvl-a"
    assert [g.get("nvlink_peers") for g in ib1["gpus"]] == [[2], [3], [0], [1]]
    assert {(g["domain"], g["fabric_state"]) for g in ib1["gpus"]} == {("nvl-a", "joined")}
    assert down["fabrics"] == ["ib-a"] and down["multi_node"] == "down: mlx5_1"
    assert (
        "nvlink_domain" not in down and "nvlink_peers" not in down["gpus"][0] and "fabric_state" not in down["gpus"][0]
    )
    assert seen["n_ibb"]["fabrics"] == ["ib-b"] and seen["n_ibb"]["multi_node"] == "ready"


def test_the_summary_counts_each_fabric_and_its_largest_free_block(fleet: Leader) -> None:
    # A node with a down adapter is on ib-a, but no block a replica across nodes could take.
    assert fabric_use(fleet) == {
        "ib-a": {"fabric": "ib-a", "nodes": 3, "nodes_with_weights": 0, "models_present": 0, "largest_free_block": 2},
        "ib-b": {"fabric": "ib-b", "nodes": 1, "nodes_with_weights": 0, "models_present": 0, "largest_free_block": 1},
    }


def test_ctl_nodes_show_prints_the_wiring(fleet: Leader) -> None:
    shown = opod_cli(fleet, "ctl", "nodes", "show", "n_ib1")
    assert shown.returncode == 0, shown.stderr
    assert (
        "multi-node" in shown.stdout and "ready" in shown.stdout and "ib-a" in shown.stdout and "nvl-a" in shown.stdout
    )
    down = opod_cli(fleet, "ctl", "nodes", "show", "n_down")
    assert "down: mlx5_1" in down.stdout, down.stdout
    summary = opod_cli(fleet, "ctl", "summary")
    assert summary.returncode == 0 and "FABRIC" in summary.stdout and "ib-b" in summary.stdout, summary.stdout


def test_a_two_node_replica_stays_on_one_fabric_and_the_others_are_explained(fleet: Leader) -> None:
    add(fleet, {"name": "wide", "profiles": [TWO_NODES], "scaling": {"min": 1, "max": 1}})
    fleet.wait_served("wide", timeout=60)
    (replica,) = replicas(fleet, "wide")
    assert sorted(s["node"] for s in replica["shards"]) == ["n_ib1", "n_ib2"], replica

    add(fleet, {"name": "wide-too", "profiles": [TWO_NODES], "scaling": {"min": 1, "max": 1}})

    def refused() -> dict[str, str]:
        status, body = fleet.admin("GET", "/api/v1/explain-placement?model=wide-too")
        assert status == 200, body
        return {r["node"]: r["reason"] for r in body.get("rejections") or []}

    wait_until(lambda: len(refused()) == 4, 30, "wide-too to be explained on every node")
    why = refused()
    assert why["n_down"].startswith("fabric: multi_node is down: mlx5_1"), why
    assert why["n_ib1"].startswith("fabric: a replica across 2 nodes stays on one fabric"), why
    assert "ib-a 1 (n_ib1); ib-b 1 (n_ibb)" in why["n_ib1"] and why["n_ibb"] == why["n_ib1"], why
    assert why["n_ib2"].startswith("gpus: needs 1 free H100, has 0 free"), why
    assert replicas(fleet, "wide-too") == []
    assert fabric_use(fleet)["ib-a"]["largest_free_block"] == 0


def test_tensor_parallel_on_one_node_takes_nvlink_peers(fleet: Leader) -> None:
    # n_ib1 has cards 1, 2 and 3 free: 1 and 2 are not linked, 1 and 3 are.
    add(
        fleet,
        {
            "name": "pair",
            "profiles": [{"engine": "sim", "gpu_class": "H100", "tp": 2}],
            "scaling": {"min": 1, "max": 1},
        },
    )
    fleet.wait_served("pair", timeout=60)
    (replica,) = replicas(fleet, "pair")
    assert [(s["node"], s["gpus"]) for s in replica["shards"]] == [("n_ib1", [1, 3])], replica
