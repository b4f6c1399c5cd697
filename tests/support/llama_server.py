"""Start a real ``llama-server`` for a test: free port, wait for health, stop its process group.

Tests that use it carry ``@pytest.mark.engine``. :func:`command` takes the route opod's own
driver would take on this CPU, and skips the test with a message when none can run here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.ports import free_port
from opod.engines import llama_binary
from opod.engines.errors import LaunchError
from opod.engines.llama_binary import Route


def command() -> list[str]:
    """The llama-server command for this machine, as opod's llama.cpp driver picks it (``opod.engines.llama_binary``):
    ``OPOD_LLAMA_SERVER``, else the prebuilt binary where the CPU has the AVX-512 it needs, else the portable
    launcher; skips when that route cannot run here."""
    try:
        route = llama_binary.resolve()
    except LaunchError as err:
        pytest.skip(f"no llama-server: {err}")
    if route.kind is Route.PORTABLE:
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            pytest.skip(f"no llama-server for this CPU: {route.why}, and the xllamacpp wheel is not installed")
    return list(route.argv)


def post_json(url: str, body: dict[str, Any], timeout: float = 60) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def running(model: Path, *args: str, alias: str = "test", threads: int = 2, timeout_s: float = 60) -> Iterator[str]:
    """Run llama-server on ``model`` with extra ``args``; yields its base URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    argv = [
        *command(),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-a",
        alias,
        "-t",
        str(threads),
        *args,
    ]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-3000:]
                    raise AssertionError(
                        f"llama-server exited with {process.returncode} before it was healthy:\n{tail}"
                    )
                with contextlib.suppress(OSError, urllib.error.URLError):
                    with urllib.request.urlopen(base + "/health", timeout=2) as response:
                        if response.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise AssertionError(f"llama-server not healthy after {timeout_s} s")
                time.sleep(0.05)
            yield base
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
