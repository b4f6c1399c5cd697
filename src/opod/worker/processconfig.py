"""How to run one process and how to tell that it is ready: :class:`ProcessConfig`.

Checked when it is made, so a bad argv or two readiness checks at once fail
with a clear message before anything is spawned. :meth:`ProcessConfig.from_spec`
reads a leader's ``ProcessSpec``, whose zeros mean the worker's defaults below.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from opod.contract import nodeapi
from opod.contract.wire import SECOND
from opod.engines.base import Readiness

# Worker defaults, also what the contract's zeros in a ProcessSpec mean.
DEFAULT_READY_TIMEOUT = 30.0
DEFAULT_MAX_RESTARTS = 5
DEFAULT_BACKOFF = 1.0
DEFAULT_MAX_BACKOFF = 30.0
DEFAULT_STABLE_AFTER = 300.0
DEFAULT_LOG_LINES = 400
DEFAULT_LOG_MAX_BYTES = 16 << 20
"""An engine log past this size is rotated: ``<name>.log`` becomes ``<name>.log.1``, and so on."""
DEFAULT_LOG_BACKUPS = 3

Probe = Callable[[], Awaitable["bool | Readiness"]]
"""A custom readiness check: ready when it answers True or ``Readiness.READY``."""


@dataclass(frozen=True)
class ProcessConfig:
    """How to run one process. ``argv`` is a list, never a shell string."""

    id: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the worker's own environment."""
    cwd: str | Path | None = None
    ready_url: str | None = None
    """Ready when a GET answers 200 (503 = still loading)."""
    health_port: int | None = None
    """Ready when a TCP connect to ``health_host:health_port`` succeeds."""
    health_host: str = "127.0.0.1"
    probe: Probe | None = None
    """A custom readiness check. No readiness at all = ready once spawned."""
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    restart: bool = False
    max_restarts: int = DEFAULT_MAX_RESTARTS
    backoff: float = DEFAULT_BACKOFF
    """Seconds before the first relaunch; doubles for each further one, up to ``max_backoff``."""
    max_backoff: float = DEFAULT_MAX_BACKOFF
    stable_after: float = DEFAULT_STABLE_AFTER
    log_lines: int = DEFAULT_LOG_LINES
    log_file: str | Path | None = None
    """Appended to: every byte the process writes, and a line per start and exit; rotated by size."""
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    log_backups: int = DEFAULT_LOG_BACKUPS
    """Rotated logs kept beside the current one (``.1`` the newest); 0 starts the log afresh instead."""
    death_signal: int = signal.SIGKILL
    """Sent to the process when the worker dies. SIGKILL is certain; its own children die in the group sweep only if the worker lives."""
    cpus: Sequence[int] = ()
    """The CPUs it runs on; empty: every CPU the worker has (an engine kept off leaders' loops: ``cpu.engine_cpus``)."""

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.id, str) or not self.id.strip():
            problems.append("id must be a non-empty string")
        if isinstance(self.argv, (str, bytes)):
            problems.append("argv must be a list of strings, not one string (no shell is used)")
        elif not self.argv:
            problems.append("argv is empty: it needs at least the program to run")
        else:
            argv = []
            for i, arg in enumerate(self.argv):
                if isinstance(arg, os.PathLike):
                    arg = os.fspath(arg)
                if not isinstance(arg, str):
                    problems.append(f"argv[{i}] is {type(arg).__name__} {arg!r}; every element must be a string")
                elif "\0" in arg:
                    problems.append(f"argv[{i}] holds a NUL byte")
                else:
                    argv.append(arg)
            if argv and not argv[0]:
                problems.append("argv[0] (the program) is empty")
            object.__setattr__(self, "argv", tuple(argv))
        for key, value in dict(self.env).items():
            if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
                problems.append(
                    f"env entry {key!r}={value!r}: names and values must be strings, names non-empty without '='"
                )
        object.__setattr__(self, "env", dict(self.env))
        kinds = [
            name
            for name, v in (("ready_url", self.ready_url), ("health_port", self.health_port), ("probe", self.probe))
            if v
        ]
        if len(kinds) > 1:
            problems.append(f"give one readiness check, not {' and '.join(kinds)}")
        if self.ready_url and urlsplit(self.ready_url).scheme not in ("http", "https"):
            problems.append(f"ready_url {self.ready_url!r} must be an http:// or https:// URL")
        if self.health_port is not None and not (0 <= self.health_port <= 65535):
            problems.append(f"health_port {self.health_port} is not a TCP port")
        if self.probe is not None and not callable(self.probe):
            problems.append("probe must be an async callable")
        for name in ("ready_timeout", "stable_after"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                problems.append(f"{name} must be a positive number of seconds")
        if not (0 <= self.backoff <= self.max_backoff):
            problems.append(f"backoff {self.backoff} must be >= 0 and at most max_backoff {self.max_backoff}")
        if self.max_restarts < 0:
            problems.append("max_restarts must be >= 0")
        if isinstance(self.cpus, (str, bytes)) or not all(type(c) is int and c >= 0 for c in self.cpus):
            problems.append(f"cpus must be CPU numbers (whole numbers from 0), not {self.cpus!r}")
        else:
            object.__setattr__(self, "cpus", tuple(sorted(set(self.cpus))))
        try:
            signal.Signals(self.death_signal)
        except ValueError:
            problems.append(f"death_signal {self.death_signal!r} is not a signal")
        if self.log_lines < 1:
            problems.append("log_lines must be >= 1")
        if self.log_max_bytes < 1 or self.log_backups < 0:
            problems.append(
                f"log_max_bytes must be >= 1 and log_backups >= 0 (got {self.log_max_bytes}, {self.log_backups})"
            )
        if problems:
            raise ValueError(f"process {self.id!r}: " + "; ".join(problems))

    @classmethod
    def from_spec(cls, spec: nodeapi.ProcessSpec) -> ProcessConfig:
        """A leader's ``ProcessSpec``; its zeros mean the worker's defaults."""
        if not spec.id:
            raise ValueError("process spec has no ID")
        if not spec.command:
            raise ValueError(f"process spec {spec.id!r} has no Command")
        host = spec.health_host or "127.0.0.1"
        port = spec.health_port if spec.health_port > 0 else None
        url = f"http://{host}:{port}/{spec.health_path.lstrip('/')}" if port and spec.health_path else None
        backoff = spec.restart_backoff / SECOND if spec.restart_backoff > 0 else DEFAULT_BACKOFF
        return cls(
            id=spec.id,
            argv=[spec.command, *(spec.args or [])],
            env=spec.env or {},
            cwd=spec.work_dir or None,
            ready_url=url,
            health_port=None if url else port,
            health_host=host,
            ready_timeout=spec.ready_timeout / SECOND if spec.ready_timeout > 0 else DEFAULT_READY_TIMEOUT,
            restart=spec.restart,
            max_restarts=spec.max_restarts if spec.max_restarts > 0 else DEFAULT_MAX_RESTARTS,
            backoff=backoff,
            max_backoff=max(backoff, DEFAULT_MAX_BACKOFF),
            log_lines=spec.log_lines if spec.log_lines > 0 else DEFAULT_LOG_LINES,
        )

    @property
    def address(self) -> str:
        """Where the process is probed (``host:port``), or ``""``."""
        if self.ready_url:
            return urlsplit(self.ready_url).netloc
        return f"{self.health_host}:{self.health_port}" if self.health_port else ""


async def probe_once(cfg: ProcessConfig, session: aiohttp.ClientSession | None) -> tuple[bool, str]:
    """Ready or not, and what was seen."""
    if session is not None and cfg.ready_url:
        try:
            async with session.get(cfg.ready_url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                # 503 is llama-server's "still loading"; anything but 200 is "not yet".
                return resp.status == 200, f"{cfg.ready_url} answered {resp.status}"
        except TimeoutError:
            return False, f"{cfg.ready_url} did not answer within 2s"
        except (aiohttp.ClientError, OSError):
            return False, f"nothing answered at {cfg.ready_url}"
    if cfg.health_port:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(cfg.health_host, cfg.health_port), 1.0)
        except (OSError, TimeoutError):
            return False, f"nothing listens on {cfg.address}"
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()
        return True, ""
    if cfg.probe is not None:
        try:
            result = await cfg.probe()
        except Exception as exc:  # a broken probe reads as "not ready"; the timeout's reason names it
            return False, f"the probe raised {exc!r}"
        return result is True or result == Readiness.READY, f"the probe answered {result!r}"
    return True, ""


class ProbeNotes(Protocol):
    """Where a readiness probe leaves what it saw last (``ManagedProcess``)."""

    probe_note: str


async def probe_until_ready(cfg: ProcessConfig, seen: ProbeNotes) -> None:
    """Probe, quickly at first and then every half second, until the check says ready.
    What each probe saw is kept in ``seen.probe_note`` for the timeout's reason."""
    delay = 0.05
    session = aiohttp.ClientSession() if cfg.ready_url else None
    try:
        while True:
            ready, seen.probe_note = await probe_once(cfg, session)
            if ready:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    finally:
        if session is not None:
            await session.close()
