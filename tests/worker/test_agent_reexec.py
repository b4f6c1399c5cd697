"""A supervised process survives its worker re-executing itself, and the new process takes it back.

A real program runs the supervisor, starts a child that writes a line every few milliseconds, hands it over
(the state file, the output descriptor kept across the exec) and re-executes itself; its second life takes the
child back, reads its output on, and restarts it when it crashes. What is not this worker's to take back (a
state file another process wrote, a pid that is not its child) is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from opod.worker import adoption, processes

PROGRAM = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from pathlib import Path
    from types import SimpleNamespace
    from opod.worker import adoption
    from opod.worker.supervisor import ProcessConfig, Supervisor

    home = Path(sys.argv[1])
    CHILD = "import time, itertools\\nfor n in itertools.count():\\n    print('tick', n, flush=True)\\n    time.sleep(0.02)\\n"

    async def first_life():
        supervisor = Supervisor()
        await supervisor.start(ProcessConfig(id="ticker", argv=[sys.executable, "-c", CHILD], restart=True, backoff=0.1,
                                             log_file=home / "ticker.log"))
        await asyncio.sleep(0.3)
        handed = supervisor.handover()
        supervisor.keep_across_exec(handed)
        book = adoption.EngineBook(home, lambda: supervisor, lambda: SimpleNamespace(engines={}))
        book.write(exec_pid=os.getpid())
        print(json.dumps({"life": 1, "pid": os.getpid(), "child": handed[0].pid}), flush=True)
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])

    async def second_life(handed):
        supervisor = Supervisor()
        (held,) = handed.processes
        process = await supervisor.adopt(held)
        await asyncio.sleep(0.4)
        read_on = process.last_lines()
        os.kill(held.pid, signal.SIGKILL)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if process.restarts == 1 and process.ready:
                break
        print(json.dumps({"life": 2, "pid": os.getpid(), "child": held.pid,
                          "read_on": read_on[-3:], "restarts": process.restarts,
                          "ready": process.ready, "new_child": process.pid}), flush=True)
        await supervisor.stop_all(grace=1.0)

    handed = adoption.read(home)
    asyncio.run(second_life(handed) if handed is not None else first_life())
""")


def test_a_process_handed_over_across_an_exec_is_taken_back_read_on_and_restarted_when_it_crashes(
    tmp_path: Path,
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(PROGRAM)
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    first, second = (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    assert first["life"] == 1 and second["life"] == 2
    assert second["pid"] == first["pid"], "the exec keeps the process"
    assert second["child"] == first["child"], "the same child, taken back"
    assert second["read_on"] and all(line.startswith("tick ") for line in second["read_on"]), second
    # The output pipe carried over: the counter goes on from where the first life left it, nothing started anew.
    assert int(second["read_on"][-1].split()[1]) > 20, second
    assert second["restarts"] == 1 and second["ready"] and second["new_child"] != first["child"], second
    log = (tmp_path / "ticker.log").read_text()
    assert "taken back pid" in log and "tick 1\n" in log


def test_a_state_file_another_process_wrote_hands_nothing_over(tmp_path: Path) -> None:
    body = {"format": adoption.FORMAT, "exec_pid": os.getpid() + 1, "processes": [], "engines": [], "listener_fd": 3}
    (tmp_path / adoption.STATE_FILE).write_text(json.dumps(body))
    assert adoption.read(tmp_path) is None, "a worker started afresh takes nothing back (its old engines died with it)"
    (tmp_path / adoption.STATE_FILE).write_text("{not json")
    assert adoption.read(tmp_path) is None


@pytest.fixture
def sleeper() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A child of this process whose stdout is a pipe; yields it and the pipe's read end."""
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=write_fd)
    os.close(write_fd)
    try:
        yield child, read_fd
    finally:
        child.kill()
        child.wait()
        os.close(read_fd)


async def test_a_pid_that_is_not_this_workers_child_is_not_taken(sleeper: tuple[subprocess.Popen[bytes], int]) -> None:
    child, read_fd = sleeper
    with pytest.raises(processes.NotAdoptable, match="another process"):
        processes.adopt(
            os.getppid(), ticks=processes.start_ticks(os.getppid()) or 0, output_fd=read_fd, on_line=lambda _: None
        )
    ticks = processes.start_ticks(child.pid)
    assert ticks is not None
    with pytest.raises(processes.NotAdoptable, match="another process"):  # a reused pid: another start time
        processes.adopt(child.pid, ticks=ticks + 1, output_fd=read_fd, on_line=lambda _: None)
    other_read, other_write = os.pipe()
    try:
        with pytest.raises(processes.NotAdoptable, match="not the pipe"):
            processes.adopt(child.pid, ticks=ticks, output_fd=other_read, on_line=lambda _: None)
    finally:
        os.close(other_read)
        os.close(other_write)


def test_the_state_file_is_removed_by_a_normal_stop(tmp_path: Path) -> None:
    book = adoption.EngineBook(tmp_path, lambda: SimpleNamespace(handover=list), lambda: SimpleNamespace(engines={}))  # type: ignore[arg-type, return-value]
    book.write()
    assert json.loads((tmp_path / adoption.STATE_FILE).read_text())["exec_pid"] == 0
    book.close()
    assert not (tmp_path / adoption.STATE_FILE).exists()
    book.changed()
    assert not (tmp_path / adoption.STATE_FILE).exists()
