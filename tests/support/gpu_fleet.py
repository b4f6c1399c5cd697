"""A leader with ``opod join`` simulator workers that each declare one A10G: the fleet the placement scenarios run on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import remove_home, sim_worker, wait_until

ONE_A10G = "gpus:\n  - {name: NVIDIA A10G, class: A10G, memory_gb: 24, compute_capability: '8.6', count: 1}\n"


@contextmanager
def declared_fleet(tmp_path: Path) -> Iterator[tuple[Leader, Callable]]:
    """A leader in the test's process, and ``join(node_id)`` starting a simulator worker with one declared A10G."""
    leader = Leader(tmp_path / "leader")
    workers = []
    token = leader.node_token()

    def join(node_id: str):
        home = tmp_path / node_id
        home.mkdir()
        (home / "inventory.yaml").write_text(ONE_A10G)
        worker = sim_worker(leader, home, node_id, token=token, OPOD_INVENTORY=str(home / "inventory.yaml"))
        workers.append(worker)
        wait_until(
            lambda: any(n.get("id") == node_id for n in (leader.admin("GET", "/api/v1/nodes")[1] or [])),
            60,
            f"{node_id} to join",
        )
        return worker

    try:
        yield leader, join
    finally:
        for worker in workers:
            worker.stop()
        leader.stop()
        remove_home(tmp_path)


def add(leader: Leader, definition: dict) -> None:
    status, body = leader.admin("POST", "/api/v1/models", definition)
    assert status == 200, body


def nodes(leader: Leader) -> dict[str, dict]:
    """``GET /api/v1/nodes`` by node id."""
    status, body = leader.admin("GET", "/api/v1/nodes")
    assert status == 200, body
    return {n["id"]: n for n in body}


def replicas(leader: Leader, model: str) -> list[dict]:
    status, body = leader.admin("GET", f"/api/v1/replicas?model={model}")
    assert status == 200, body
    return body
