"""One process per opod home: a lock on a file in it, held for the life of the process.

Two leaders on one home would share one database, one admin key and one models folder
and fail somewhere deep inside. ``flock`` is released by the kernel when the holder
exits however it exits (a crash or ``kill -9`` included), so a stale lock never has to
be cleaned up by hand; the file only says who holds it, for the error message.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "opod.lock"

_held: dict[Path, int] = {}
"""Open descriptors of the locks this process holds: closing one would release its lock."""


class HomeInUse(Exception):
    """Another process holds the home; the message names it and what to do."""


def hold(home: Path, what: str) -> None:
    """Lock ``home`` for this process (``what`` names it: ``opod up``); :class:`HomeInUse` when another holds it.

    Idempotent within a process. The descriptor is not inherited by child processes
    (engines), so the lock ends with this process, not with the last engine.
    """
    home = home.expanduser().resolve()
    if home in _held:
        return
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # the home holds the keys and the store: its user's alone
    path = home / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise HomeInUse(_message(home, holder, what)) from None
    except OSError:
        # A filesystem without locks: run unguarded rather than refuse to start.
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {int(time.time())} {what}\n".encode())
    _held[home] = fd


def release(home: Path) -> None:
    """Let go of ``home`` before this process exits (tests; the kernel does it at exit)."""
    fd = _held.pop(home.expanduser().resolve(), None)
    if fd is not None:
        os.close(fd)


def _holder(fd: int) -> tuple[int, str] | None:
    try:
        text = os.pread(fd, 512, 0).decode(errors="replace")
        pid, _, rest = text.strip().partition(" ")
        _started, _, command = rest.partition(" ")
        return int(pid), command or "opod"
    except (OSError, ValueError):
        return None


def _message(home: Path, holder: tuple[int, str] | None, what: str) -> str:
    if holder is None:
        who, stop = "another opod process", "stop it first"
    else:
        pid, command = holder
        who, stop = f"{command} (pid {pid})", f"stop that one first (Ctrl-C where it runs, or kill {pid})"
    return (
        f"the opod home {home} is in use by {who}; {stop}, "
        f"or give this {what} a home of its own: OPOD_HOME=/another/dir {what}"
    )
