"""Starting opod processes for a benchmark and finding the engines they run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

OPOD = [sys.executable, "-m", "opod"]


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live process below it (children, their children…), from /proc; a zombie is left out."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def checkout_commit(tree: Path) -> str:
    """The commit a checkout's tree is at (``+ uncommitted changes`` when its tracked files differ from it), as a
    results table names it; "unknown" outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=tree, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


class Proc:
    def __init__(
        self, args: list[str], home: Path, env: dict[str, str] | None = None, program: list[str] | None = None
    ) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
        base.update(OPOD_HOME=str(home), PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1", **(env or {}))
        self.proc = subprocess.Popen(
            (program or OPOD) + args,
            env=base,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = regex.search(line)
                if match:
                    return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{pattern!r} not seen within {timeout}s:\n" + "\n".join(self.lines[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


def ready_replicas(admin_url: str, key: str, model: str) -> int:
    """``ready_replicas`` of ``model``'s ``ModelView`` in ``GET /api/v1/models`` (the workers the router sends it to);
    0 while the model is not listed."""
    request = urllib.request.Request(admin_url + "/api/v1/models")
    request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=10) as response:
        views = json.loads(response.read())
    return next((int(v.get("ready_replicas") or 0) for v in views if v.get("name") == model), 0)


def wait_model_ready(admin_url: str, key: str, model: str, replicas: int = 1, timeout: float = 90.0) -> None:
    """Until the leader's management API says ``model`` has ``replicas`` ready replicas, as ``opod ctl models ls`` shows."""
    deadline = time.monotonic() + timeout
    ready = 0
    while time.monotonic() < deadline:
        ready = ready_replicas(admin_url, key, model)
        if ready >= replicas:
            return
        time.sleep(0.3)
    raise RuntimeError(f"the leader saw {model} ready on {ready} of {replicas} workers after {timeout}s")
