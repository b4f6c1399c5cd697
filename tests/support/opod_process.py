"""Run ``opod up`` / ``opod join`` / ``opod sim`` as real processes for end-to-end tests.

Each process gets its own ``OPOD_HOME`` and free ports; its output is kept for
assertions and for the failure message; stopping it sends SIGINT (what Ctrl-C
does) and checks that no child process outlives it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.ports import free_port
from bench.procs import process_tree

OPOD = [sys.executable, "-m", "opod"]


NO_INSTALL = "{python} -c \"raise SystemExit('this test installs nothing')\""


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_") and k not in ("HF_ENDPOINT", "HF_TOKEN")}
    env.update(OPOD_HOME=str(home), COLUMNS="200", NO_COLOR="1", PYTHONUNBUFFERED="1")
    # A release or engine build an operator asks for is never fetched from a registry here: the tests
    # that install one name their own command.
    env.update(OPOD_UPGRADE_COMMAND=NO_INSTALL, OPOD_ENGINE_INSTALL_COMMAND=NO_INSTALL)
    # Leaders here keep Python's own allocator: the huge-page heap (opod.cli.heap) starts a leader about half a
    # second later (glibc's malloc through the imports), over a hundred times a run; tests/cli/test_heap.py runs it.
    env.update(OPOD_HUGE_PAGES="0")
    env.update(extra)
    return env


class OpodProcess:
    def __init__(self, args: list[str], home: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            OPOD + args,
            env=env or clean_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{' '.join(self.args)} never printed {text!r} within {timeout}s; output:\n{self.output}")

    def children(self) -> list[int]:
        """Every process in this process's session (engines run in their own groups, same session or not)."""
        return descendants(self.proc.pid)

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C, then wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(
                f"{' '.join(self.args)} did not stop within {timeout}s after Ctrl-C; output:\n{self.output}"
            ) from err
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        """SIGKILL the opod process alone (its engines must follow it by themselves)."""
        self.proc.kill()
        self.proc.wait()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    return process_tree(pid)[1:]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def http(
    method: str, url: str, body: object | None = None, key: str | None = None, timeout: float = 30.0
) -> tuple[int, dict, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None or method not in ("GET", "HEAD"):
        request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status, headers = response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        raw, status, headers = error.read(), error.code, {k.lower(): v for k, v in error.headers.items()}
    try:
        parsed: object = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")
    return status, headers, parsed


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Leader:
    """``opod up`` on free ports with its own home; ``key`` is its admin key."""

    def __init__(
        self,
        home: Path,
        *,
        worker: bool = True,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        """``ports`` = (public, admin) to come back on the same addresses after a restart."""
        self.port, self.admin_port = ports or (free_port(), free_port())
        self.worker_port = free_port()
        args = ["up", "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin_port}"]
        args += ["--worker-listen", f"127.0.0.1:{self.worker_port}"] if worker else ["--no-worker"]
        self.home = home
        self.process = OpodProcess(args + (extra or []), home, env=clean_env(home, **(env or {})))
        self.process.wait_for_line("OpenAI API on", timeout=60)
        self.key = (home / "admin.key").read_text().strip()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def admin(self, method: str, path: str, body: object | None = None) -> tuple[int, object]:
        status, _, parsed = http(method, self.admin_url + path, body, key=self.key)
        return status, parsed

    def served(self) -> set[str]:
        status, _, body = http("GET", self.url + "/v1/models", key=self.key)
        return {m["id"] for m in body["data"]} if status == 200 else set()

    def wait_served(self, *models: str, timeout: float = 90.0) -> None:
        wait_until(
            lambda: set(models) <= self.served(), timeout, f"{models} to be served; output:\n{self.process.output}"
        )

    def node_token(self) -> str:
        status, body = self.admin("POST", "/api/v1/node-tokens", {"name": "test"})
        assert status == 201, body
        return body["secret"]

    def cli_env(self) -> dict[str, str]:
        return clean_env(self.home, OPOD_ADMIN_URL=self.admin_url)


def sim_worker(leader: Leader, home: Path, node_id: str, *, token: str | None = None, **env: str) -> OpodProcess:
    """``opod join`` with the simulator engine, as node ``node_id``, with its own home and ``env`` on top."""
    args = [
        "join",
        leader.url,
        "--token",
        token or leader.node_token(),
        "--engine",
        "sim",
        "--listen",
        f"127.0.0.1:{free_port()}",
    ]
    return OpodProcess(args, home, env=clean_env(home, OPOD_NODE_ID=node_id, **env))


def usage_rows(leader: Leader) -> list:
    """Every usage row the leader offers on ``/admin/v1/usage/stream``, read page by page to the end."""
    from opod.contract import adminapi

    rows: dict[int, adminapi.UsageEvent] = {}
    after = 0
    while True:
        status, _, body = http("GET", f"{leader.url}/admin/v1/usage/stream?after={after}&limit=1000", key=leader.key)
        assert status == 200, body
        page = adminapi.UsageBatch.from_wire(body)
        for event in page.events or []:
            rows[event.id] = event
        after = page.next
        if not page.more:
            return list(rows.values())


def opod_cli(leader: Leader, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(OPOD + list(args), env=leader.cli_env(), capture_output=True, text=True, timeout=timeout)


def remove_home(home: Path) -> None:
    shutil.rmtree(home, ignore_errors=True)
