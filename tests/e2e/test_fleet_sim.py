"""A leader with two simulator workers: placement, routing, and a worker killed under load.

No client may see a 502 when a worker dies: requests that hit it before their
first byte move to the other worker, and the dead worker leaves the rotation.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import openai
import pytest

from bench.ports import free_port
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, alive, clean_env, http, opod_cli, wait_until

MODEL = "sim-chat"


@pytest.fixture
def fleet(tmp_path: Path):
    leader = Leader(tmp_path / "leader")
    token = leader.node_token()
    workers = {}
    for name in ("n_sim-a", "n_sim-b"):
        home = tmp_path / name
        env = clean_env(home, OPOD_NODE_ID=name)
        workers[name] = OpodProcess(
            ["join", leader.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{free_port()}"],
            home,
            env=env,
        )
    for worker in workers.values():
        worker.wait_for_line("registered with", timeout=30)
    added = opod_cli(leader, "model", "add", MODEL, "--engine", "sim", "--no-load")
    assert added.returncode == 0, added.stderr
    for name in workers:
        placed = opod_cli(leader, "model", "load", MODEL, "--node", name)
        assert placed.returncode == 0, placed.stderr
    wait_until(lambda: _holders(leader) == set(workers), 60, "both workers to serve the model")
    yield leader, workers
    for worker in workers.values():
        if worker.proc.poll() is None:
            worker.stop()
    leader.stop()


def _holders(leader: Leader) -> set[str]:
    status, _, body = http("GET", leader.url + "/admin/v1/nodes", key=leader.key)
    return {n["id"] for n in body if MODEL in n["loaded_models"]} if status == 200 else set()


def test_requests_spread_over_both_workers(fleet) -> None:
    leader, workers = fleet
    seen = set()
    for _ in range(20):
        status, headers, body = http(
            "POST",
            leader.url + "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            key=leader.key,
        )
        assert status == 200, body
        seen.add(headers["x-opod-worker"])
    assert seen == set(workers)


def test_node_ls_shows_each_worker_its_machine_and_models_and_rm_refuses_a_live_one(fleet) -> None:
    leader, workers = fleet
    listed = opod_cli(leader, "node", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == set(workers)
    for row in rows.values():
        assert (row["state"], row["engines"], row["replicas"]) == ("ready", ["sim"], 1)
        assert row["os"].startswith("linux/") and row["cpu_count"] >= 1
        assert 0 < row["disk_free_gb"] <= row["disk_total_gb"], row  # the filesystem holding the worker's home
    table = opod_cli(leader, "node", "ls")
    assert table.returncode == 0, table.stderr
    for name in workers:
        line = next(line for line in table.stdout.splitlines() if line.startswith(name))
        assert "ready" in line and re.search(r" \d+/\d+ GiB ", line) and MODEL in line, line
    refused = opod_cli(leader, "node", "rm", "n_sim-a")
    assert (
        refused.returncode == 1 and "is reachable (it heartbeats)" in refused.stderr and "(HTTP 409)" in refused.stderr
    ), refused.stderr


def test_a_worker_killed_under_load_costs_no_client_an_error(fleet) -> None:
    leader, workers = fleet
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)
    outcomes: list[object] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                answer = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "go"}], max_tokens=8
                )
                outcomes.append(answer.choices[0].message.content)
            except openai.APIStatusError as err:
                outcomes.append(err)
            except openai.APIConnectionError as err:
                outcomes.append(err)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(outcomes) >= 50, 30, "load to flow")
    victim = workers["n_sim-a"]
    engines = victim.children()
    victim.kill()
    before = len(outcomes)
    wait_until(lambda: len(outcomes) >= before + 200, 60, "requests after the kill")
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    errors = [o for o in outcomes if isinstance(o, Exception)]
    assert errors == [], f"{len(errors)} of {len(outcomes)} requests failed: {errors[:3]}"
    time.sleep(1)
    assert [pid for pid in engines if alive(pid)] == [], "the killed worker's engine outlived it"
    status, body = leader.admin("GET", "/api/v1/nodes")
    states = {n["id"]: n["state"] for n in body}
    assert states["n_sim-b"] == "ready"
