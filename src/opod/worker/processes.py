"""The operating-system side of running an engine: spawn, output, exit, and killing its process group.

A child starts in a session (and so a process group) of its own, with stdin on
``/dev/null`` and stdout and stderr merged into one pipe that the event loop
reads continuously. Before exec it asks the kernel for a death signal
(``PR_SET_PDEATHSIG``), so it dies with the worker even when the worker is
killed by SIGKILL. Its exit is noticed through a pidfd without reaping it
first: while the leader is an unreaped zombie its pid, and so its process
group id, cannot be reused, which makes the sweep of leftover group members
safe. Linux-only parts degrade to plain behaviour elsewhere.

A worker that restarts itself re-executes its own program in the same process
(:func:`os.execv`, same pid), so its children stay its children, and takes them
back with :func:`adopt`. The death signal is tied to the thread that forked, and
exec ends every thread but the one calling it: children are spawned and the exec
is called from the event loop's (main) thread, so neither ends that thread. The
output pipe is what carries over: its read end is the one descriptor made
inheritable just before the exec (:meth:`Child.keep_output_across_exec`), and the
new process reads it on from the same descriptor number. A pipe rather than a
log file the engine writes itself, because the worker keeps rotating the log and
keeping the last lines in memory as before; the pipe's buffer holds what the
engine writes during the moments the new process takes to start.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import signal
import stat as stat_module
import subprocess
import threading
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO, Protocol

from opod.http import cpu

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

MAX_LINE = 8192
"""A line longer than this is cut, so a newline-less stream cannot grow memory without bound."""
READ_CHUNK = 65536
READS_PER_WAKEUP = 16
"""Bounded so a child that writes without pause cannot hold the event loop."""
STRAGGLER_WAIT = 5.0
"""How long an exit waits for killed group members to be gone (GPU memory is freed at their death)."""
POLL_INTERVAL = 0.1
"""Exit polling where pidfds are missing."""

_SIGNAL_DETAIL = {
    signal.SIGILL: "illegal instruction",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGFPE: "floating-point exception",
    signal.SIGABRT: "aborted",
}


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved once here: the child must do as little as possible between fork and exec.
_prctl = _load_prctl()
_warned_thread = False


class SpawnError(RuntimeError):
    """The program could not be started at all (missing binary, no permission, bad working directory)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def describe_exit(returncode: int) -> str:
    """A person's words for a return code (negative = the signal that killed it, as :mod:`subprocess` says)."""
    if returncode >= 0:
        return f"exit status {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"killed by signal {number}"
    detail = _SIGNAL_DETAIL.get(signal.Signals(number))
    return f"killed by {name} ({detail})" if detail else f"killed by {name}"


def adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans (``PR_SET_CHILD_SUBREAPER``).

    Without it, an engine's leftover children reparent to pid 1, which in some
    containers never reaps them. Process-wide and permanent; returns False where
    the kernel does not offer it.
    """
    if _prctl is None:
        return False
    return _prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) == 0


def _child_setup(parent_pid: int, death_signal: int, cpus: frozenset[int] | None = None) -> None:
    """Runs in the child between fork and exec."""
    # An engine takes SIGTERM and Ctrl-C whatever its parent thread blocked (``opod join`` blocks them on
    # every thread but the loop's, and on that one too across a restart).
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)  # kept off leaders' event loops (``cpu.engine_cpus``)
        except OSError:
            cpu.free_child()  # a CPU since taken from the worker: every one it has
    else:
        cpu.free_child()  # the CPUs the leader had, not its event loop's one
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(death_signal), 0, 0, 0)
    # The parent may have died before the request took hold; then no signal would ever come.
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), death_signal)


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after the last ')' are fixed.
    return data[data.rindex(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (``/proc/<pid>/stat`` field 22): with the pid, who it is."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def fd_inode(fd: int) -> int | None:
    """The inode of the pipe open on ``fd``; None when ``fd`` is not open or not a pipe."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_ino if stat_module.S_ISFIFO(st.st_mode) else None


def stdout_inode(pid: int) -> int | None:
    """The inode of the pipe on ``pid``'s stdout (``/proc/<pid>/fd/1`` reads ``pipe:[N]``); None when unknown."""
    try:
        link = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    return int(link[6:-1]) if link.startswith("pipe:[") and link.endswith("]") else None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, pgrp)`` from ``/proc/<pid>/stat``, or None when there is no such process."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0].decode(), int(fields[1]), int(fields[2]))


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has spent so far; 0 when there is no such process."""
    fields = _stat_fields(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_members(pgid: int) -> set[int]:
    """Every process (zombies included) in process group ``pgid``; empty without ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    members = set()
    for name in names:
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat[2] == pgid:
                members.add(int(name))
    return members


def _gone(pid: int, pgid: int) -> bool:
    """True when ``pid`` no longer runs in ``pgid``; reaps it when it is our zombie (we are its reaper)."""
    stat = proc_stat(pid)
    if stat is None or stat[2] != pgid:
        return True
    if stat[0] != "Z":
        return False
    if stat[1] == os.getpid():
        with suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return True


class LogSink(Protocol):
    """Where a child's output is copied: a file opened to append, or a :class:`RotatingLog`."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class RotatingLog:
    """A log file opened to append, rotated by size as the standard library's ``RotatingFileHandler`` does.

    Past ``max_bytes`` the file is renamed ``<path>.1`` (``.1`` to ``.2``, and so on, the oldest beyond
    ``backups`` dropped) and a new one begun, so a long-lived engine's log cannot fill the disk. The cut
    falls after the last whole line of a write where there is one. A rotation that fails (a rename
    refused) is logged and the current file written on, so no output is lost for it.
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, backups: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._file: BinaryIO = open(self.path, "ab")
        self._size = self._file.tell()

    def write(self, data: bytes, /) -> int:
        written = len(data)
        if self._size + written > self.max_bytes:
            cut = data.rfind(b"\n") + 1
            if cut:
                self._put(data[:cut])  # the whole lines end this file, the rest begins the next
                data = data[cut:]
                self._rotate()
            elif self._size >= self.max_bytes:
                self._rotate()  # no line ends in this write: cut between writes
        if data:
            self._put(data)
        return written

    def _put(self, data: bytes) -> None:
        self._file.write(data)
        self._size += len(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def _rotate(self) -> None:
        self._file.close()
        try:
            if self.backups == 0:
                self.path.unlink(missing_ok=True)
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
            if self.backups:
                self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        except OSError as exc:
            log.warning("cannot rotate %s (%s); writing on to it", self.path, exc)
        self._file = open(self.path, "ab")
        self._size = self._file.tell()


class _Output:
    """Reads a child's merged stdout/stderr as it comes, line by line, into a callback and a log file."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, on_line: Callable[[str], None], sink: LogSink | None
    ) -> None:
        self._loop = loop
        self._fd: int | None = fd
        self._on_line = on_line
        self._sink = sink
        self._partial = bytearray()
        self._sink_mid_line = False
        os.set_blocking(fd, False)
        loop.add_reader(fd, self.drain, READS_PER_WAKEUP)

    @property
    def fd(self) -> int | None:
        return self._fd

    def drain(self, max_reads: int = READS_PER_WAKEUP) -> None:
        while self._fd is not None and max_reads > 0:
            max_reads -= 1
            try:
                chunk = os.read(self._fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return
            self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        if self._sink is not None:
            try:
                self._sink.write(chunk)
                self._sink.flush()
                self._sink_mid_line = not chunk.endswith(b"\n")
            except (OSError, ValueError) as exc:
                log.warning("log file write failed, no longer writing it: %s", exc)
                self._sink = None
        self._partial += chunk
        *lines, rest = self._partial.split(b"\n")
        for line in lines:
            self._emit(line)
        self._partial = bytearray(rest)
        while len(self._partial) > MAX_LINE:
            self._emit(bytes(self._partial[:MAX_LINE]))
            del self._partial[:MAX_LINE]

    def _emit(self, line: bytes | bytearray) -> None:
        self._on_line(line.decode("utf-8", "replace").rstrip("\r"))

    def close(self) -> None:
        """Read what is left, keep an unterminated last line, and stop reading."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            while True:
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    break
                self._feed(chunk)
        except OSError:
            pass
        if self._partial:
            self._emit(bytes(self._partial))
            self._partial.clear()
        if self._sink is not None and self._sink_mid_line:
            with suppress(OSError, ValueError):
                self._sink.write(b"\n")  # so what the supervisor writes next starts a line
        self._loop.remove_reader(fd)
        os.close(fd)


class Child:
    """One spawned (or adopted) process, leader of its own process group (pgid == pid).

    ``reap`` waits for its exit status once its exit is known (negative = the signal, as :mod:`subprocess` says).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, pid: int, reap: Callable[[], int], output: _Output) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = loop
        self._reap = reap
        self._output = output
        self._reaped = False
        self._stop_deadline: float | None = None
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd: int | None = None
        self._finisher: asyncio.Task[None] | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self._poll_later()
        else:
            loop.add_reader(self._pidfd, self._leader_exited)

    @property
    def done(self) -> bool:
        return self._exited.done()

    async def wait(self) -> int:
        """The return code once the leader is reaped and its group is gone."""
        # Shielded: cancelling a waiter must never cancel the exit itself.
        return await asyncio.shield(self._exited)

    @property
    def output_fd(self) -> int | None:
        """The descriptor its output is read from; None once it is closed."""
        return self._output.fd

    def keep_output_across_exec(self) -> None:
        """Let the output's descriptor survive this process's exec (it is close-on-exec otherwise)."""
        fd = self._output.fd
        if fd is not None:
            os.set_inheritable(fd, True)

    def signal_group(self, sig: int) -> None:
        # Only while the leader is unreaped: after that the group id may belong to someone else.
        if self._reaped:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def terminate(self, grace: float) -> int:
        """SIGTERM to the group; SIGKILL to whatever is left after ``grace`` seconds; reaped when it returns."""
        if self._exited.done():
            return self._exited.result()
        deadline = self._loop.time() + grace
        if self._stop_deadline is None:
            self.signal_group(signal.SIGTERM)
        # A second, shorter stop (a stop during a readiness-timeout kill) shortens the grace.
        self._stop_deadline = min(deadline, self._stop_deadline or deadline)
        remaining = max(0.0, self._stop_deadline - self._loop.time())
        await asyncio.wait([self._exited], timeout=remaining)
        if not self._exited.done():
            self._stop_deadline = self._loop.time()
            self.signal_group(signal.SIGKILL)
        return await self.wait()

    def _poll_later(self) -> None:
        self._loop.call_later(POLL_INTERVAL, self._poll)

    def _poll(self) -> None:
        try:
            # WNOWAIT: notice the exit but leave the zombie, so the group id stays ours until the sweep.
            exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            exited = True  # reaped by someone else; Popen says what it can
        if exited:
            self._leader_exited()
        else:
            self._poll_later()

    def _leader_exited(self) -> None:
        if self._finisher is not None:
            return
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._output.drain(max_reads=256)
        self._finisher = self._loop.create_task(self._finish())

    async def _finish(self) -> None:
        try:
            if self._stop_deadline is not None:
                # A stop is under way: the rest of the group keeps its grace to shut down. Nothing
                # signals when another process's children exit, so this looks, briefly, in turn.
                while self._loop.time() < self._stop_deadline and self._live_members():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            self.signal_group(signal.SIGKILL)
            stragglers = group_members(self.pid) - {self.pid}
            self.returncode = self._reap()
            self._reaped = True
            deadline = self._loop.time() + STRAGGLER_WAIT
            while stragglers and self._loop.time() < deadline:
                stragglers = {p for p in stragglers if not _gone(p, self.pid)}
                if stragglers:
                    await asyncio.sleep(0.02)
            if stragglers:
                log.warning(
                    "pids %s of group %d outlived SIGKILL for %.0fs", sorted(stragglers), self.pid, STRAGGLER_WAIT
                )
        finally:
            self._output.close()
            if not self._exited.done():
                self._exited.set_result(self.returncode if self.returncode is not None else -signal.SIGKILL)

    def _live_members(self) -> bool:
        return any(p != self.pid and not _gone(p, self.pid) for p in group_members(self.pid))


def spawn(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    on_line: Callable[[str], None],
    sink: LogSink | None = None,
    death_signal: int = signal.SIGKILL,
    cpus: frozenset[int] | None = None,
) -> Child:
    """Start ``argv`` in a new session; call from the event loop's thread. ``cpus``: the CPUs it runs on (``None``:
    every CPU the worker had).

    The death signal is tied to the *thread* that forks, so a loop running in a
    short-lived thread would take its children with it when the thread ends.
    """
    global _warned_thread
    loop = asyncio.get_running_loop()
    if threading.current_thread() is not threading.main_thread() and not _warned_thread:
        _warned_thread = True
        log.warning("spawning engines from a non-main thread: they die when this thread ends (PR_SET_PDEATHSIG)")
    read_fd, write_fd = os.pipe()
    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            env=env,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
            preexec_fn=functools.partial(_child_setup, os.getpid(), death_signal, cpus),
        )
    except OSError as exc:
        os.close(read_fd)
        # The filename says which of program and working directory was missing.
        where = f" ({exc.filename})" if exc.filename and exc.filename != argv[0] else ""
        raise SpawnError(f"could not start {argv[0]}: {exc.strerror or exc}{where}", exc.errno) from exc
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return Child(loop, popen.pid, popen.wait, _Output(loop, read_fd, on_line, sink))


class NotAdoptable(RuntimeError):
    """The recorded process is not there to take back: gone, someone else's, or its output pipe is not the one recorded."""


def adopt(
    pid: int, *, ticks: int, output_fd: int, on_line: Callable[[str], None], sink: LogSink | None = None
) -> Child:
    """Take back a child this process started before it re-executed itself; call from the event loop's thread.

    ``ticks`` is the start time recorded for ``pid`` (:func:`start_ticks`), so a reused pid is never
    taken; ``output_fd`` is the inherited read end of its output pipe, checked to be the pipe on its
    stdout. Raises :class:`NotAdoptable` saying why not.
    """
    loop = asyncio.get_running_loop()
    stat = proc_stat(pid)
    if stat is None:
        raise NotAdoptable(f"pid {pid} is no longer running")
    # A zombie of ours is taken too: it ended during the restart, and its supervisor hears the exit at once.
    if stat[1] != os.getpid() or start_ticks(pid) != ticks:
        raise NotAdoptable(f"pid {pid} is another process now (not the child this worker started)")
    inode = fd_inode(output_fd)
    if inode is None:
        raise NotAdoptable(f"the output pipe of pid {pid} (descriptor {output_fd}) did not survive the restart")
    theirs = stdout_inode(pid)
    if theirs is not None and theirs != inode:
        raise NotAdoptable(f"descriptor {output_fd} is not the pipe pid {pid} writes its output to")
    os.set_inheritable(output_fd, False)  # an engine started from now on must not hold it open
    return Child(loop, pid, functools.partial(_waitpid, pid), _Output(loop, output_fd, on_line, sink))


def _waitpid(pid: int) -> int:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return -signal.SIGKILL  # reaped elsewhere: its status is lost
    return os.waitstatus_to_exitcode(status)
