"""``POST /api/v1/agents/restart`` on a real leader and a real ``opod join`` worker: the agent starts again as a
new process (same pid, a new boot id) while its engine process keeps running and the model keeps serving.

Chat requests go through the leader with the ``openai`` client the whole time; one in flight at the
moment of the exec may be cut, none after it.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import (
    OpodProcess,
    alive,
    descendants,
    http,
    opod_cli,
    remove_home,
    sim_worker,
    wait_until,
)

openai = pytest.importorskip("openai")

MODEL = "sim-chat"


def boot_id(leader: Leader, node: str) -> str:
    """The boot id the leader holds for ``node`` (``/admin/v1/nodes``)."""
    status, _, body = http("GET", f"{leader.url}/admin/v1/nodes", key=leader.key)
    assert status == 200, body
    return next(n["boot_id"] for n in body if n["id"] == node)  # type: ignore[union-attr]


def node_view(leader: Leader, node: str) -> dict:
    status, body = leader.admin("GET", "/api/v1/nodes")
    assert status == 200, body
    assert isinstance(body, list)
    return next(n for n in body if n["id"] == node)


def replica_ids(leader: Leader) -> list[str]:
    status, body = leader.admin("GET", f"/api/v1/replicas?model={MODEL}")
    assert status == 200, body
    return sorted(r["id"] for r in body or [])


class Chats:
    """Chat requests one after another on a thread, each remembered as (start, end, error or "")."""

    def __init__(self, leader: Leader) -> None:
        self.client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)
        self.done: list[tuple[float, float, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                answer = self.client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
                )
                error = "" if answer.choices[0].message.content else "an empty answer"
            except openai.OpenAIError as err:
                error = f"{type(err).__name__}: {err}"
            self.done.append((start, time.monotonic(), error))
            time.sleep(0.02)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=40)


NODE = "n_again"


@dataclass
class Serving:
    leader: Leader
    worker: OpodProcess
    engines: list[int]
    """The worker's engine processes."""


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Serving]:
    """A leader, and an ``opod join`` worker serving the model from a simulator engine of its own."""
    leader = Leader(tmp_path / "leader")
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(leader, tmp_path / "worker", NODE)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        engines = descendants(worker.proc.pid)
        assert engines, "the worker runs its engine as a child process"
        yield Serving(leader, worker, engines)
    finally:
        if worker is not None and worker.proc.poll() is None:
            worker.stop()
        leader.stop()
        remove_home(tmp_path)


def test_agents_restart_starts_the_agent_as_a_new_process_and_the_engine_keeps_serving(
    serving: Serving, tmp_path: Path
) -> None:
    leader, worker, engines = serving.leader, serving.worker, serving.engines
    first_boot = boot_id(leader, NODE)
    replicas = replica_ids(leader)
    chats = Chats(leader)
    wait_until(lambda: len(chats.done) >= 5, 30, "chats before the restart")

    restarted_at = time.monotonic()
    status, body = leader.admin("POST", "/api/v1/agents/restart")
    assert status == 200 and body == {"nodes": [NODE]}, body

    wait_until(lambda: boot_id(leader, NODE) != first_boot, 30, "the worker's new boot id")
    wait_until(lambda: MODEL in leader.served(), 30, "the model to be served again")
    back_at = time.monotonic()
    wait_until(lambda: len([c for c in chats.done if c[0] > back_at]) >= 10, 30, "chats after the restart")
    chats.finish()

    assert worker.proc.poll() is None, worker.output
    assert descendants(worker.proc.pid) == engines and all(alive(pid) for pid in engines), worker.output
    assert "restarting as a new process" in worker.output
    failed = [c for c in chats.done if c[2]]
    # Only a request that was in flight when the process re-executed itself may have been cut.
    assert len(failed) <= 1, failed
    assert all(start < back_at for start, _, _ in failed), failed
    assert [c for c in chats.done if c[0] > restarted_at], "chats went on through the restart"
    assert replica_ids(leader) == replicas, "nothing was placed again"
    view = node_view(leader, NODE)
    assert "agent_upgrade" in view.get("features", []), view

    # A normal stop still stops the engine, and leaves nothing to hand over.
    assert worker.stop() == 0, worker.output
    assert not any(alive(pid) for pid in engines)
    assert not (tmp_path / "worker" / "engines.json").exists()


def test_a_ctrl_c_while_the_worker_restarts_stops_it_and_its_engine(serving: Serving) -> None:
    """Ctrl-C the moment the worker says it restarts: it lands while the new process starts (its imports, before
    it listens for signals), and still stops the worker the usual way, its engine with it."""
    leader, worker, engines = serving.leader, serving.worker, serving.engines
    status, body = leader.admin("POST", "/api/v1/agents/restart")
    assert status == 200 and body == {"nodes": [NODE]}, body
    deadline = time.monotonic() + 30
    while not any("restarting as a new process" in line for line in list(worker.lines)):
        assert time.monotonic() < deadline, worker.output
        time.sleep(0.001)
    worker.proc.send_signal(signal.SIGINT)

    try:
        code = worker.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not stop after a Ctrl-C during its restart:\n{worker.output}") from None
    worker._reader.join(timeout=5)
    assert code == 0, worker.output
    assert "Traceback" not in worker.output and "KeyboardInterrupt" not in worker.output, worker.output
    assert worker.output.rstrip().endswith("stopped"), worker.output
    wait_until(lambda: not any(alive(pid) for pid in engines), 10, "the engine to stop with its worker")
