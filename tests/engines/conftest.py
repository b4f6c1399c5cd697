"""Helpers for the engine tests: free ports, engine processes, a scriptable fake engine, the tiny GGUF."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from opod.engines.base import EngineDriver, Readiness

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from opod.weights.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@functools.cache
def sim_problem() -> str | None:
    """Why ``python -m opod sim`` cannot run here, or ``None`` when it can."""
    try:
        done = subprocess.run([sys.executable, "-m", "opod", "sim", "--help"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"python -m opod sim did not answer --help ({err})"
    if done.returncode != 0:
        lines = [line.strip(" │╭╰─╮╯") for line in done.stderr.decode(errors="replace").splitlines()]
        said = next((line for line in reversed(lines) if line and not line.startswith("Try ")), "no message")
        return f"python -m opod sim is not available yet (exit {done.returncode}: {said})"
    return None


class EngineProcess:
    """One engine child in its own process group, its output kept in a temporary file."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        assert all(isinstance(a, str) for a in argv), argv
        self.argv = argv
        self.log = tempfile.TemporaryFile()
        full_env = {**os.environ, **(env or {})}
        self.process = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    async def wait_ready(
        self, driver: EngineDriver, session: aiohttp.ClientSession, base_url: str, timeout: float = 60
    ) -> list[Readiness]:
        """Probe through the driver until READY; every distinct answer seen, in order."""
        seen: list[Readiness] = []
        deadline = time.monotonic() + timeout
        while True:
            state = await driver.readiness(session, base_url)
            if not seen or seen[-1] != state:
                seen.append(state)
            if state is Readiness.READY:
                return seen
            if self.process.poll() is not None:
                raise AssertionError(
                    f"{self.argv[:4]} exited with {self.process.returncode} before it was ready:\n{self.output()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"not ready after {timeout} s (seen {seen}):\n{self.output()[-3000:]}")
            await asyncio.sleep(0.05)

    def stop(self, timeout: float = 15) -> int:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        return self.process.returncode


@contextlib.asynccontextmanager
async def engine_process(argv: list[str], env: dict[str, str] | None = None) -> AsyncIterator[EngineProcess]:
    proc = EngineProcess(argv, env)
    try:
        yield proc
    finally:
        proc.stop()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def fake_engine(routes: dict[tuple[str, str], Handler]) -> AsyncIterator[str]:
    """An HTTP server answering only ``routes`` ((method, path) → handler); yields its base URL."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def status(code: int, body: str = "") -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=code, text=body)

    return handler


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s
