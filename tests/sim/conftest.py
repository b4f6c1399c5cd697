"""Simulators for the tests: in a thread (fast) or as ``python -m opod sim`` (for crashes and the CLI)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from opod.sim import SimConfig, running
from opod.sim.server import SimHandle

REPO = Path(__file__).resolve().parents[2]
ENGINE_WIRE = REPO.parent / "shared" / "notes" / "engine-wire"

# No latency unless a test asks for it: answers come back as fast as the simulator can make them.
FAST = dict(port=0, ttft_ms=0.0, prefill_ms_per_token=0.0, itl_ms=0.0, itl_ms_per_request=0.0)


@pytest.fixture
def sim() -> Iterator[Callable[..., SimHandle]]:
    """``sim(**options)`` starts a simulator in a thread for the test; all of them stop at its end."""
    with contextlib.ExitStack() as stack:

        def start(**options: object) -> SimHandle:
            cfg = SimConfig(**{**FAST, **options})  # type: ignore[arg-type]
            return stack.enter_context(running(cfg))

        yield start


@dataclasses.dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    url: str
    banner: str


_BANNER = re.compile(r"listening on (http://\S+)")


def spawn(*args: str, wait_listening: bool = True) -> SimProcess:
    """``python -m opod sim --port 0 ARGS`` with its banner read (the banner comes before listening)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "opod", "sim", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = _BANNER.search(line)
    if not match:
        proc.kill()
        raise AssertionError(f"no banner from opod sim: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    url = match.group(1)
    if wait_listening:
        import httpx

        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(url + "/sim/state", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    proc.kill()
                    raise AssertionError("opod sim did not start listening") from None
                time.sleep(0.02)
    return SimProcess(proc, url, line.strip())


@pytest.fixture
def sim_process() -> Iterator[Callable[..., SimProcess]]:
    procs: list[SimProcess] = []

    def start(*args: str, wait_listening: bool = True) -> SimProcess:
        p = spawn(*args, wait_listening=wait_listening)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.proc.poll() is None:
            p.proc.terminate()
            try:
                p.proc.wait(5)
            except subprocess.TimeoutExpired:
                p.proc.kill()
