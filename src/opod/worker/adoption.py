"""A worker that restarts as a new process with its engines kept serving: the state file, and taking engines back.

``opod join``'s worker restarts (``POST /v1/opod/agent/restart``, or after an
upgrade) by re-executing its own program in the same process (:func:`os.execv`,
same pid), so its engine processes stay its children and keep serving. The new
process learns what it had from ``<home>/engines.json``, written atomically on
every engine change: per supervised process its :class:`ProcessConfig`, pid,
start time, restarts and output descriptor; per engine its model, port, launch
spec, replica, profile, fingerprint, devices and ranks. The file also marks the
exec itself (``exec_pid``, written just before it): only then are its
descriptors this process's own, so a worker started afresh (after a crash, whose
engines died with it) drops every entry. A process is taken back only when its
pid is still this process's child with the recorded start time and its output
pipe is the recorded one; others are dropped, and one of ours that cannot be
taken back is killed, so nothing runs unwatched. The worker's listening socket
is handed over the same way, so connections made during the exec wait in its
backlog instead of being refused.

A normal stop stops every engine and removes the file: only the restart keeps
engines. A load still fetching its weights is not handed over; the restart waits
for it (:func:`fetching`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from opod.engines.base import LaunchSpec
from opod.worker import processes
from opod.worker.engines import EngineManager
from opod.worker.model_engine import ModelEngine
from opod.worker.multinode import Ranks
from opod.worker.supervisor import Handover, NotAdoptable, ProcessConfig, ProcessExists, Supervisor

log = logging.getLogger("opod.worker")

STATE_FILE = "engines.json"
FORMAT = 1
KEPT_STATES = ("starting", "serving", "following")
"""Engine states handed over; a load still fetching its weights is not."""
TAKE_BACK_WAIT = 15.0
"""How long a new process waits for its taken-back engines' first readiness probe before it registers."""


@dataclass
class Handed:
    """What the previous process of this worker handed over, read back after the exec."""

    processes: list[Handover] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)
    listener_fd: int = -1
    upgrade: str = ""
    """The release an upgrade installed just before the exec ("" = a plain restart)."""
    inodes: dict[str, int] = field(default_factory=dict)
    """process id → the inode of its output pipe, to close the descriptor of one not taken back."""


def fetching(manager: EngineManager) -> list[str]:
    """Models whose weights are still being fetched: a restart now would lose their loads."""
    return sorted(m for m, e in manager.engines.items() if e.state == "fetching")


class EngineBook:
    """``<home>/engines.json``: rewritten (atomically) soon after every engine change, removed on a normal stop."""

    def __init__(self, home: Path, supervisor: Callable[[], Supervisor], manager: Callable[[], EngineManager]) -> None:
        """``supervisor`` and ``manager`` give the parts it describes (built after the book, which they notify)."""
        self.path = home / STATE_FILE
        self._supervisor = supervisor
        self._manager = manager
        self._soon: asyncio.Handle | None = None
        self.closed = False

    def changed(self) -> None:
        """An engine or process changed: write the file once this turn of the loop is over."""
        if self.closed or self._soon is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._soon = loop.call_soon(self._write_now)

    def _write_now(self) -> None:
        self._soon = None
        if not self.closed:
            self.write()

    def write(self, *, exec_pid: int = 0, listener_fd: int = -1, upgrade: str = "") -> None:
        """Write the file whole; with ``exec_pid`` it is the handover an exec of that process reads."""
        body = describe(self._supervisor(), self._manager())
        body.update(exec_pid=exec_pid, listener_fd=listener_fd, upgrade=upgrade)
        partial = self.path.with_name(self.path.name + ".tmp")
        try:
            partial.write_text(json.dumps(body, indent=1))
            partial.replace(self.path)
        except OSError as err:
            log.warning("cannot write %s (%s): a restart of this worker would start its engines again", self.path, err)

    def close(self) -> None:
        """The worker stopped its engines: nothing to hand over any more."""
        self.closed = True
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        self.path.unlink(missing_ok=True)


def describe(supervisor: Supervisor, manager: EngineManager) -> dict[str, Any]:
    """The processes a re-executed worker can take back, and the engines they are."""
    handed = supervisor.handover()
    ids = {h.config.id for h in handed}
    engines = [
        _engine_body(e)
        for e in manager.engines.values()
        if e.state in KEPT_STATES and (e.process_id in ids or (not e.process_id and e.state == "following"))
    ]
    return {"format": FORMAT, "processes": [_process_body(h) for h in handed], "engines": engines}


def read(home: Path) -> Handed | None:
    """What the previous process handed over, when this process is the exec it wrote the file for; else None."""
    path = home / STATE_FILE
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("ignoring %s: %s", path, err)
        return None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("exec_pid") != os.getpid():
        return None  # a worker started afresh: the engines recorded there ended with the last one
    handed = Handed(listener_fd=int(body.get("listener_fd", -1)), upgrade=str(body.get("upgrade") or ""))
    for item in body.get("processes") or []:
        try:
            handed.processes.append(_handover(item))
            handed.inodes[item["config"]["id"]] = int(item.get("output_inode") or 0)
        except (KeyError, TypeError, ValueError) as err:
            log.warning("%s: a process entry cannot be read (%s); dropped", path, err)
    handed.engines = [e for e in body.get("engines") or [] if isinstance(e, dict)]
    return handed


def inherited_listener(handed: Handed | None, host: str, port: int) -> socket.socket | None:
    """The listening socket the previous process handed over, when it listens where this worker should."""
    if handed is None or handed.listener_fd < 0:
        return None
    try:
        sock = socket.socket(fileno=handed.listener_fd)
    except OSError:
        return None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        name = sock.getsockname()
    except OSError:
        listening, name = False, ("", -1)
    if (
        not listening
        or sock.type != socket.SOCK_STREAM
        or (port and name[1] != port)
        or (host not in ("0.0.0.0", "::", "") and name[0] != host)
    ):
        sock.detach()  # not ours to close: whatever holds that number now keeps it
        return None
    sock.set_inheritable(False)
    sock.setblocking(False)
    return sock


async def take_back(handed: Handed, supervisor: Supervisor, manager: EngineManager) -> list[str]:
    """Adopt every process handed over and register its engine; waits (briefly) for their first readiness
    probe, so the first heartbeat lists them. Answers the models taken back."""
    adopted: set[str] = set()
    for held in handed.processes:
        try:
            await supervisor.adopt(held)
        except (NotAdoptable, ProcessExists) as err:
            log.warning("not taking back process %s: %s", held.config.id, err)
            _let_go(held, handed.inodes.get(held.config.id, 0))
            continue
        adopted.add(held.config.id)
    waits = []
    models = []
    for body in handed.engines:
        try:
            engine = _engine(body, manager)
        except (KeyError, TypeError, ValueError) as err:
            log.warning("an engine entry of %s cannot be read (%s); dropped", STATE_FILE, err)
            continue
        if engine.process_id and engine.process_id not in adopted:
            continue
        serving = engine.state == "serving"
        task = manager.adopt(engine)
        models.append(engine.model_id)
        if task is not None and serving:
            waits.append(task)  # one still starting may take minutes: the heartbeat does not wait for it
    if waits:
        await asyncio.wait(waits, timeout=TAKE_BACK_WAIT)
    if models:
        log.info("taken back after the restart: %s", ", ".join(models))
    return models


def _let_go(held: Handover, inode: int) -> None:
    """A process not taken back: close its pipe, and kill it when it is still our child (none runs unwatched)."""
    if inode and processes.fd_inode(held.output_fd) == inode:
        with suppress(OSError):
            os.close(held.output_fd)
    stat = processes.proc_stat(held.pid)
    if stat is not None and stat[1] == os.getpid() and processes.start_ticks(held.pid) == held.ticks:
        with suppress(OSError):
            os.killpg(held.pid, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(held.pid, 0)


# --- the file's bodies ---------------------------------------------------------------


def _process_body(h: Handover) -> dict[str, Any]:
    config = {f.name: _plain(getattr(h.config, f.name)) for f in dataclasses.fields(ProcessConfig) if f.name != "probe"}
    return {
        "config": config,
        "pid": h.pid,
        "ticks": h.ticks,
        "output_fd": h.output_fd,
        "output_inode": processes.fd_inode(h.output_fd) or 0,
        "started_at": h.started_at.isoformat(),
        "restarts": h.restarts,
    }


def _handover(item: dict[str, Any]) -> Handover:
    names = {f.name for f in dataclasses.fields(ProcessConfig)} - {"probe"}
    config = ProcessConfig(**{k: v for k, v in item["config"].items() if k in names})
    return Handover(
        config=config,
        pid=int(item["pid"]),
        ticks=int(item["ticks"]),
        output_fd=int(item["output_fd"]),
        started_at=datetime.fromisoformat(item["started_at"]),
        restarts=int(item.get("restarts", 0)),
    )


def _engine_body(e: ModelEngine) -> dict[str, Any]:
    return {
        "model_id": e.model_id,
        "state": e.state,
        "detail": e.detail,
        "port": e.port,
        "process_id": e.process_id,
        "spec": _plain(dataclasses.asdict(e.spec)) if e.spec is not None else None,
        "replica": e.replica,
        "profile": e.profile,
        "fingerprint": e.fingerprint,
        "devices": e.devices,
        "env": e.env,
        "ranks": {"rank": e.ranks.rank, "peers": list(e.ranks.peers)} if e.ranks is not None else None,
        "extra_argv": e.extra_argv,
    }


def _engine(body: dict[str, Any], manager: EngineManager) -> ModelEngine:
    spec = body.get("spec")
    ranks = body.get("ranks")
    return ModelEngine(
        model_id=str(body["model_id"]),
        driver=manager.driver,
        state=str(body["state"]),
        detail=str(body.get("detail") or ""),
        port=int(body["port"]),
        process_id=str(body.get("process_id") or ""),
        spec=LaunchSpec(**{**spec, "launcher": tuple(spec.get("launcher") or ())}) if spec else None,
        replica=str(body.get("replica") or ""),
        profile=int(body.get("profile") or 0),
        fingerprint=str(body.get("fingerprint") or ""),
        devices=body.get("devices"),
        env=dict(body.get("env") or {}),
        ranks=Ranks(rank=int(ranks["rank"]), peers=tuple(ranks["peers"])) if ranks else None,
        extra_argv=list(body.get("extra_argv") or []),
    )


def _plain(value: Any) -> Any:
    """A value as JSON holds it: paths as text, tuples and mappings as lists and objects."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
