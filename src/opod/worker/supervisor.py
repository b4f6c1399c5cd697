"""Runs engine processes, tells when they are ready, restarts them with back-off, and reports their state.

States of a :class:`ManagedProcess` (``ProcessState``) and what moves them::

    start() ──▶ STARTING ──ready──▶ RUNNING ──exit 0──▶ STOPPED
                   │                   │
                   │                   └─abnormal exit─▶ BACKOFF ──delay──▶ STARTING (restarts + 1)
                   │                                        (restart on, it has been ready, tries left)
                   └─exit or readiness timeout─▶ FAILED     (restart off, or it never became ready)
    an abnormal exit with no tries left ──▶ CRASHLOOP
    stop() from any live state ──▶ STOPPING ──▶ STOPPED     (never restarts)
    adopt() ──▶ STARTING ──ready──▶ RUNNING ...             (a process started before this worker re-executed
                                                             itself: as if it had been ready, so a later crash
                                                             restarts it; its readiness time counts from adoption)

A process that has never been ready is not restarted: a bad model, a missing
library or an illegal instruction will fail the same way again, and the caller
(the SIGILL fallback, the operator) should hear it at once. The restart policy
protects a process that has worked. A launch that stays ready for
``stable_after`` seconds clears the run of crashes that back-off and the
restart budget count, so a rare crash weeks apart is never a crash loop;
``restarts`` itself counts for the worker's whole life, as the contract says.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shlex
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from opod.contract import nodeapi
from opod.contract.wire import ZERO_TIME, format_time
from opod.http import cpu
from opod.worker import processes
from opod.worker.exit_lines import DETAIL_LINES, telling_line
from opod.worker.processconfig import ProcessConfig, probe_until_ready
from opod.worker.processes import NotAdoptable, SpawnError, describe_exit

__all__ = [
    "Handover",
    "ManagedProcess",
    "NotAdoptable",
    "ProcessConfig",
    "ProcessExists",
    "ProcessState",
    "SpawnError",
    "Supervisor",
    "UnknownProcess",
]

log = logging.getLogger(__name__)

TIMEOUT_GRACE = 5.0
"""Grace given to a process killed for not becoming ready."""


class ProcessState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    CRASHLOOP = "crashloop"


FINAL = frozenset({ProcessState.STOPPED, ProcessState.FAILED, ProcessState.CRASHLOOP})

_PROCESS_WORD = {
    ProcessState.STARTING: nodeapi.ProcessStatus.STARTING,
    ProcessState.RUNNING: nodeapi.ProcessStatus.RUNNING,
    ProcessState.BACKOFF: nodeapi.ProcessStatus.STARTING,  # it is coming back; "poll until it leaves starting"
    ProcessState.STOPPING: nodeapi.ProcessStatus.STOPPED,
    ProcessState.STOPPED: nodeapi.ProcessStatus.STOPPED,
    ProcessState.FAILED: nodeapi.ProcessStatus.FAILED,
    ProcessState.CRASHLOOP: nodeapi.ProcessStatus.CRASHLOOP,
}


class UnknownProcess(KeyError):
    def __str__(self) -> str:
        return f"no process {self.args[0]!r} on this worker"


class ProcessExists(ValueError):
    """A live process already has this id."""


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Handover:
    """What a worker that re-executes itself needs to take one running process back (:meth:`Supervisor.adopt`)."""

    config: ProcessConfig
    pid: int
    ticks: int
    """Its start time (``/proc/<pid>/stat``), so a reused pid is not taken for it."""
    output_fd: int
    """The read end of its output pipe, inherited across the exec."""
    started_at: datetime
    restarts: int


class ManagedProcess:
    """One supervised process as the worker sees it; changed only by its :class:`Supervisor`."""

    def __init__(self, config: ProcessConfig) -> None:
        self.config = config
        self.id = config.id
        self.state = ProcessState.STARTING
        self.since = _now()
        """When ``state`` was entered."""
        self.pid: int | None = None
        self.started_at: datetime | None = None
        """When the current (or last) launch was spawned."""
        self._waiting_from = self.since
        """When the wait for readiness began: the spawn, or the adoption."""
        self.restarts = 0
        """Automatic relaunches in this worker's lifetime."""
        self.exit_code: int | None = None
        """Of the last exit; negative = killed by that signal."""
        self.exit_reason = ""
        """Why it last ended, in words: ``exit status 1``, ``killed by SIGKILL``, ``did not become ready within 30s``."""
        self.exit_lines: list[str] = []
        """The log's last lines when it last ended."""
        self.ever_ready = False
        self.probe_note = ""
        """What the last readiness probe saw (``… answered 503``, ``nothing listens on …``)."""
        self._lines: collections.deque[str] = collections.deque(maxlen=config.log_lines)
        self._crashes = 0  # abnormal exits since the last stable run
        self._abnormal = False
        self._ready_at = 0.0
        self._engine_word = nodeapi.EngineStateWord.STARTING
        self._engine_since = self.since
        self._child: processes.Child | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._log: processes.LogSink | None = None

    @property
    def ready(self) -> bool:
        return self.state is ProcessState.RUNNING

    @property
    def live(self) -> bool:
        return self.state not in FINAL

    def last_lines(self, n: int | None = None) -> list[str]:
        """The newest ``n`` lines of stdout and stderr together (all kept lines when ``n`` is None)."""
        lines = list(self._lines)
        return lines if n is None else lines[-n:] if n > 0 else []

    def engine_state(self) -> nodeapi.EngineState:
        """What the heartbeat says about this process when it is the worker's engine."""
        word = self._engine_word
        detail = ""
        if word is not nodeapi.EngineStateWord.SERVING and self.exit_reason:
            telling = telling_line(self.exit_lines)
            detail = f"{self.exit_reason}: {telling}" if telling else self.exit_reason
        return nodeapi.EngineState(
            state=word.value, restarts=self.restarts, since=format_time(self._engine_since), detail=detail
        )

    def info(self) -> nodeapi.ProcessInfo:
        """The contract's view (``/v1/process/get``)."""
        return nodeapi.ProcessInfo(
            id=self.id,
            command=self.config.argv[0],
            args=list(self.config.argv[1:]),
            pid=self.pid or 0,
            started_at=self.started_at or ZERO_TIME,
            status=_PROCESS_WORD[self.state].value,
            exit_err=self.exit_reason if self._abnormal else "",
            address=self.config.address,
            restarts=self.restarts,
        )

    def _word(self) -> nodeapi.EngineStateWord:
        if self.state is ProcessState.RUNNING:
            return nodeapi.EngineStateWord.SERVING
        if self.state in (ProcessState.STARTING, ProcessState.BACKOFF):
            # "Exited and restarted more than once": the second crash in a row turns starting into a loop.
            return nodeapi.EngineStateWord.CRASH_LOOPING if self._crashes >= 2 else nodeapi.EngineStateWord.STARTING
        return nodeapi.EngineStateWord.STOPPED

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.id} {self.state.value} pid={self.pid} restarts={self.restarts}>"


class Supervisor:
    """Starts processes, watches each with a task of its own, and stops them by process group.

    Use it from the event loop's (main) thread: children are tied to the
    thread that spawned them and die with the worker. A worker that re-executes
    itself hands its processes over (:meth:`handover`) and the new process takes
    each back (:meth:`adopt`).
    """

    def __init__(
        self, on_change: Callable[[ManagedProcess], object] | None = None, *, adopt_orphans: bool = False
    ) -> None:
        """``on_change`` is called on every state change. ``adopt_orphans`` makes this process the
        reaper of its engines' orphaned children (process-wide, see :func:`processes.adopt_orphans`)."""
        self._on_change = on_change
        self._procs: dict[str, ManagedProcess] = {}
        self._callbacks: set[asyncio.Future[object]] = set()
        self._hurried = False
        self._kills: set[asyncio.Task[int]] = set()
        if adopt_orphans and not processes.adopt_orphans():
            log.warning("cannot become the reaper of orphaned engine children on this system")

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_all()

    # --- the API ---------------------------------------------------------

    async def start(self, config: ProcessConfig) -> ManagedProcess:
        """Spawn the process and return at once; a task watches it from here on.

        Raises :class:`ProcessExists` when a live process has this id, and
        :class:`SpawnError` when the program cannot be started at all (the
        process is then recorded as failed).
        """
        old = self._procs.get(config.id)
        if old is not None and old.live:
            raise ProcessExists(f"process {config.id!r} is already {old.state.value}; stop it first")
        mp = ManagedProcess(config)
        self._procs[config.id] = mp
        if config.log_file is not None:
            try:
                Path(config.log_file).parent.mkdir(parents=True, exist_ok=True)
                # A local file opened to append: no wait worth a thread.
                mp._log = processes.RotatingLog(config.log_file, config.log_max_bytes, config.log_backups)
            except OSError as exc:
                self._finish(mp, ProcessState.FAILED, f"cannot open log file: {exc}", abnormal=True)
                raise SpawnError(
                    f"process {config.id!r}: cannot open log file {config.log_file}: {exc.strerror}"
                ) from exc
        try:
            self._spawn(mp)
        except SpawnError as exc:
            self._finish(mp, ProcessState.FAILED, str(exc), abnormal=True)
            raise
        mp._task = asyncio.get_running_loop().create_task(self._supervise(mp), name=f"supervise {config.id}")
        return mp

    async def wait_ready(self, id: str, timeout: float | None = None) -> bool:
        """True once the process is ready; False as soon as it ends or is stopped without being
        ready (without waiting out its readiness timeout), or when ``timeout`` seconds pass first.
        On False, ``get(id)`` tells the state, ``exit_reason`` and ``exit_lines``."""
        mp = self._require(id)
        with suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not mp.ready:
                    if mp.state in FINAL or mp.state is ProcessState.STOPPING:
                        return False
                    await mp._changed.wait()
        return mp.ready

    async def stop(self, id: str, grace: float = 10.0) -> ManagedProcess:
        """SIGTERM to its process group, SIGKILL after ``grace`` seconds; reaped when this returns.
        Never restarts it; stopping a stopped process does nothing. After :meth:`hurry`, SIGKILL at once."""
        mp = self._require(id)
        if not mp.live:
            return mp
        if self._hurried:
            grace = 0.0
        if mp._stop_task is None:
            mp._stop_task = asyncio.get_running_loop().create_task(self._stop(mp, grace))
        await asyncio.shield(mp._stop_task)
        return mp

    async def stop_all(self, grace: float = 10.0) -> None:
        await asyncio.gather(*(self.stop(mp.id, grace) for mp in list(self._procs.values()) if mp.live))

    def hurry(self) -> None:
        """Stop at once from now on (a second Ctrl-C): every stop under way, and every later one, kills
        with SIGKILL instead of waiting out its grace for an engine that ignores SIGTERM mid-answer."""
        self._hurried = True
        for mp in self._procs.values():
            child = mp._child
            if mp.state is ProcessState.STOPPING and child is not None and not child.done:
                # A second, shorter terminate cuts the first one's grace short (Child.terminate).
                task = asyncio.get_running_loop().create_task(child.terminate(0.0), name=f"kill {mp.id}")
                self._kills.add(task)
                task.add_done_callback(self._kills.discard)

    async def adopt(self, held: Handover) -> ManagedProcess:
        """Take back a process this worker started before it re-executed itself, and watch it from here on.

        It starts out ``STARTING`` until its readiness check answers (one probe, when it serves), and counts
        as having been ready, so a crash later restarts it. Raises :class:`NotAdoptable` when it is not the
        process recorded (the caller drops it), :class:`ProcessExists` when a live process has its id.
        """
        config = held.config
        old = self._procs.get(config.id)
        if old is not None and old.live:
            raise ProcessExists(f"process {config.id!r} is already {old.state.value}")
        mp = ManagedProcess(config)
        if config.log_file is not None:
            with suppress(OSError):  # the log is a copy; the process is taken back without it
                mp._log = processes.RotatingLog(config.log_file, config.log_max_bytes, config.log_backups)
        try:
            mp._child = processes.adopt(
                held.pid, ticks=held.ticks, output_fd=held.output_fd, on_line=mp._lines.append, sink=mp._log
            )
        except NotAdoptable:
            if mp._log is not None:
                mp._log.close()
            raise
        self._procs[config.id] = mp
        mp.pid, mp.started_at, mp.restarts, mp.ever_ready = held.pid, held.started_at, held.restarts, True
        self._log_note(mp, f"taken back pid {mp.pid} after the worker restarted")
        if config.ready_url or config.health_port or config.probe:
            mp._waiting_from = _now()
            self._set(mp, ProcessState.STARTING)
        else:
            self._mark_ready(mp)
        mp._task = asyncio.get_running_loop().create_task(self._supervise(mp), name=f"supervise {config.id}")
        return mp

    def handover(self) -> list[Handover]:
        """Every process a re-executed worker can take back: running or starting, with a readiness check it can
        write down (a custom probe cannot be)."""
        out = []
        for mp in self._procs.values():
            child = mp._child
            if (
                mp.state not in (ProcessState.STARTING, ProcessState.RUNNING)
                or child is None
                or child.done
                or mp.config.probe
            ):
                continue
            ticks, fd = processes.start_ticks(child.pid), child.output_fd
            if ticks is None or fd is None or mp.started_at is None:
                continue
            out.append(
                Handover(
                    config=mp.config,
                    pid=child.pid,
                    ticks=ticks,
                    output_fd=fd,
                    started_at=mp.started_at,
                    restarts=mp.restarts,
                )
            )
        return out

    def keep_across_exec(self, handed: Sequence[Handover]) -> None:
        """Make the output descriptors of ``handed`` survive this process's exec (they are close-on-exec otherwise)."""
        for held in handed:
            child = self._procs[held.config.id]._child
            if child is not None:
                child.keep_output_across_exec()

    def unhanded(self) -> list[str]:
        """Live processes :meth:`handover` leaves out (stopped before an exec, so none outlives it unwatched)."""
        handed = {h.config.id for h in self.handover()}
        return [mp.id for mp in self._procs.values() if mp.live and mp.id not in handed]

    def get(self, id: str) -> ManagedProcess | None:
        return self._procs.get(id)

    def list(self) -> list[ManagedProcess]:
        return [*self._procs.values()]

    def process_info(self, id: str) -> nodeapi.ProcessInfo:
        return self._require(id).info()

    def forget(self, id: str) -> None:
        """Drop a process that has ended from the table."""
        mp = self._require(id)
        if mp.live:
            raise ProcessExists(f"process {id!r} is {mp.state.value}; stop it before forgetting it")
        del self._procs[id]

    # --- supervision -----------------------------------------------------

    def _require(self, id: str) -> ManagedProcess:
        mp = self._procs.get(id)
        if mp is None:
            raise UnknownProcess(id)
        return mp

    def _spawn(self, mp: ManagedProcess) -> None:
        cfg = mp.config
        env = {**os.environ, **cfg.env}
        mp._child = processes.spawn(
            cfg.argv,
            env=env,
            cwd=os.fspath(cfg.cwd) if cfg.cwd is not None else None,
            on_line=mp._lines.append,
            sink=mp._log,
            death_signal=cfg.death_signal,
            cpus=frozenset(cfg.cpus) or None,
        )
        mp.pid = mp._child.pid
        mp.started_at = mp._waiting_from = _now()
        where = f" on CPUs {cpu.cpu_list(cfg.cpus)}" if cfg.cpus else ""  # kept off leaders' loops
        self._log_note(mp, f"started pid {mp.pid}{where}: {shlex.join(cfg.argv)}")
        if cfg.ready_url or cfg.health_port or cfg.probe:
            self._set(mp, ProcessState.STARTING)
        else:
            self._mark_ready(mp)

    def _mark_ready(self, mp: ManagedProcess) -> None:
        mp.ever_ready = True
        mp._ready_at = asyncio.get_running_loop().time()
        self._set(mp, ProcessState.RUNNING)

    async def _supervise(self, mp: ManagedProcess) -> None:
        try:
            await self._follow(mp)
        except Exception as exc:  # a bug here must not leave an engine running unwatched
            log.exception("supervising process %s failed", mp.id)
            if mp._child is not None and not mp._child.done:
                await mp._child.terminate(TIMEOUT_GRACE)
            self._finish(mp, ProcessState.FAILED, f"supervisor error: {exc!r}", abnormal=True)

    async def _follow(self, mp: ManagedProcess) -> None:
        """Launch after launch until the process ends for good; the state machine's transitions live here."""
        cfg = mp.config
        loop = asyncio.get_running_loop()
        spawn_error: SpawnError | None = None
        while True:
            if spawn_error is None:
                code, reason = await self._launch(mp)
            else:
                code, reason = None, str(spawn_error)
                mp.exit_lines = [reason]
            mp.exit_code = code
            if mp.ready and code == 0:
                self._finish(mp, ProcessState.STOPPED, reason, abnormal=False)
                return
            if mp.ready and loop.time() - mp._ready_at >= cfg.stable_after:
                mp._crashes = 0
            mp._crashes += 1
            if not (cfg.restart and mp.ever_ready):
                self._finish(mp, ProcessState.FAILED, reason, abnormal=True)
                return
            if mp._crashes > cfg.max_restarts:
                self._finish(mp, ProcessState.CRASHLOOP, reason, abnormal=True)
                return
            mp.exit_reason, mp._abnormal = reason, True
            delay = min(cfg.backoff * 2 ** (mp._crashes - 1), cfg.max_backoff)
            log.warning(
                "process %s: %s; restarting in %.3gs (%d of %d)", mp.id, reason, delay, mp._crashes, cfg.max_restarts
            )
            self._set(mp, ProcessState.BACKOFF)
            await asyncio.sleep(delay)
            mp.restarts += 1
            try:
                self._spawn(mp)
                spawn_error = None
            except SpawnError as exc:
                spawn_error = exc  # a failed try like any other: back off again or give up

    async def _launch(self, mp: ManagedProcess) -> tuple[int, str]:
        """Follow one launch to its end: its return code and why it ended."""
        child = mp._child
        assert child is not None
        if mp.state is ProcessState.STARTING and not await self._until_ready_or_exit(mp, child):
            code = await child.terminate(TIMEOUT_GRACE)
            reason = f"did not become ready within {mp.config.ready_timeout:g}s"
            if mp.probe_note:
                reason += f" ({mp.probe_note})"
        else:
            code = await child.wait()
            reason = describe_exit(code)
        mp.exit_lines = mp.last_lines(DETAIL_LINES)
        self._log_note(mp, f"pid {mp.pid} ended: {reason}")
        return code, reason

    async def _until_ready_or_exit(self, mp: ManagedProcess, child: processes.Child) -> bool:
        """True once ready or once the process ended (the caller reads which); False on the timeout."""
        cfg = mp.config
        remaining = cfg.ready_timeout - (_now() - mp._waiting_from).total_seconds()
        probing = asyncio.get_running_loop().create_task(probe_until_ready(mp.config, mp))
        exited = asyncio.ensure_future(child.wait())
        try:
            done, _ = await asyncio.wait(
                {probing, exited}, timeout=max(remaining, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            # Not awaited: awaiting here could swallow a cancel meant for this task (a stop).
            probing.cancel()
            exited.cancel()
        if exited in done or child.done:
            return True
        if probing in done:
            self._mark_ready(mp)
            return True
        return False

    async def _stop(self, mp: ManagedProcess, grace: float) -> None:
        if mp._task is not None:
            mp._task.cancel()
            with suppress(asyncio.CancelledError):
                await mp._task
        if not mp.live:  # it ended on its own while the watcher was being cancelled
            return
        self._set(mp, ProcessState.STOPPING)
        child = mp._child
        if child is not None and not child.done:
            mp.exit_code = await child.terminate(grace)
            mp.exit_lines = mp.last_lines(DETAIL_LINES)
            self._log_note(mp, f"pid {mp.pid} stopped: {describe_exit(mp.exit_code)}")
            self._finish(mp, ProcessState.STOPPED, describe_exit(mp.exit_code), abnormal=False)
        else:
            self._finish(mp, ProcessState.STOPPED, mp.exit_reason or "stopped", abnormal=False)

    def _finish(self, mp: ManagedProcess, state: ProcessState, reason: str, *, abnormal: bool) -> None:
        mp.exit_reason, mp._abnormal = reason, abnormal
        if mp._log is not None:
            mp._log.close()
            mp._log = None
        self._set(mp, state)

    def _set(self, mp: ManagedProcess, state: ProcessState) -> None:
        now = _now()
        mp.state, mp.since = state, now
        word = mp._word()
        if word is not mp._engine_word:
            mp._engine_word, mp._engine_since = word, now
        # Wake every waiter, then give later waiters a fresh event.
        mp._changed.set()
        mp._changed = asyncio.Event()
        self._notify(mp)

    def _notify(self, mp: ManagedProcess) -> None:
        if self._on_change is None:
            return
        try:
            result = self._on_change(mp)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                future = asyncio.ensure_future(result)
                self._callbacks.add(future)
                future.add_done_callback(self._callback_done)
        except Exception:
            log.exception("on_change callback failed for process %s", mp.id)

    def _callback_done(self, future: asyncio.Future[object]) -> None:
        self._callbacks.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("on_change callback failed", exc_info=future.exception())

    def _log_note(self, mp: ManagedProcess, text: str) -> None:
        if mp._log is not None:
            with suppress(OSError, ValueError):
                one_line = text.replace("\n", "\\n")
                mp._log.write(f"--- opod {format_time(_now())} {one_line}\n".encode())
                mp._log.flush()
