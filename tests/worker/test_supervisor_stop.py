"""The supervisor's engine logs rotated by size, and a stop that a second Ctrl-C makes immediate, on real processes."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time
from pathlib import Path

from opod.worker.processes import RotatingLog
from opod.worker.supervisor import ProcessConfig, ProcessState, Supervisor


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


async def wait_for(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def all_lines(log_file: Path) -> list[str]:
    """The lines of a rotated log and its backups, oldest first."""
    files = sorted(log_file.parent.glob(log_file.name + ".*"), key=lambda p: -int(p.suffix[1:])) + [log_file]
    return [line for path in files for line in path.read_text().splitlines()]


async def test_an_engine_log_is_rotated_by_size_and_keeps_every_line_of_the_last_files(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "engine-m.log"
    # 600 KB: four files or more even where a busy machine's reader takes whole 64 KiB reads past each limit.
    child = """
        import sys
        for i in range(6000):
            print(f"line {i:05d} " + "x" * 90, flush=i % 100 == 0)
    """
    supervisor = Supervisor()
    p = await supervisor.start(
        ProcessConfig(id="chatty", argv=py(child), log_file=log_file, log_max_bytes=64 * 1024, log_backups=3)
    )
    await wait_for(lambda: not p.live)
    assert p.exit_reason == "exit status 0"
    backups = sorted(path.name for path in log_file.parent.iterdir())
    assert backups == [
        "engine-m.log",
        "engine-m.log.1",
        "engine-m.log.2",
        "engine-m.log.3",
    ]  # the oldest beyond 3 dropped
    for path in log_file.parent.iterdir():
        assert path.stat().st_size <= 64 * 1024 + 65536, f"{path.name} grew past its limit by more than one write"
    lines = all_lines(log_file)
    numbers = [int(line.split()[1]) for line in lines if line.startswith("line ")]
    assert numbers == list(range(numbers[0], 6000)), "no line lost or cut between the kept files"
    assert lines[-1].endswith(f"pid {p.pid} ended: exit status 0")


def test_a_rotating_log_cuts_after_whole_lines_and_appends_to_what_is_there(tmp_path: Path) -> None:
    path = tmp_path / "e.log"
    path.write_bytes(b"from before\n")
    log = RotatingLog(path, max_bytes=32, backups=1)
    log.write(b"0123456789 a\n0123456789 b\n0123")  # past 32 bytes: the whole lines stay, the rest starts anew
    log.write(b"456789 c\n")
    log.flush()
    log.close()
    assert (tmp_path / "e.log.1").read_bytes() == b"from before\n0123456789 a\n0123456789 b\n"
    assert path.read_bytes() == b"0123456789 c\n"


async def test_hurry_kills_an_engine_that_ignores_sigterm_at_once() -> None:
    stubborn = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("busy", flush=True)
        time.sleep(60)
    """
    supervisor = Supervisor()
    p = await supervisor.start(ProcessConfig(id="generating", argv=py(stubborn)))
    await wait_for(lambda: p.last_lines(1) == ["busy"])
    t0 = time.monotonic()
    stopping = asyncio.ensure_future(supervisor.stop("generating", grace=10))
    await wait_for(lambda: p.state is ProcessState.STOPPING)
    await asyncio.sleep(0.2)
    supervisor.hurry()  # the second Ctrl-C
    await asyncio.wait_for(stopping, 3)
    assert time.monotonic() - t0 < 3
    assert (p.state, p.exit_code) == (ProcessState.STOPPED, -signal.SIGKILL)

    q = await supervisor.start(ProcessConfig(id="later", argv=py(stubborn)))
    await wait_for(lambda: q.last_lines(1) == ["busy"])
    t0 = time.monotonic()
    await supervisor.stop("later", grace=10)  # after hurry, every stop kills at once
    assert time.monotonic() - t0 < 2 and q.exit_code == -signal.SIGKILL
