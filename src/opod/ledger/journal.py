"""The ledger's append-only journal: what makes a usage row survive a crash before its commit.

Files live in ``<home>/ledger/``:

- ``lock``: held with ``flock`` by the one ledger using this directory. The kernel drops it when
  the process dies (even by SIGKILL), so a crashed leader never blocks its successor, while a
  second live leader on the same home is refused instead of turning the first one's requests in
  flight into ``interrupted`` rows.
- ``journal-<n>.jsonl``: segments, oldest first. Each line is one JSON object ending in ``\\n``:
  a header ``{"journal": "opod-ledger", "version": 1, "boot": …, "ts_us": …}`` opening the
  segment, then records (``"rec": "start" | "end" | "event"``, see ``records.py``). A segment may
  end in NUL bytes (room a writer reserved and never wrote); readers skip them.

Appending a record is one ``os.write`` of its line on an ``O_APPEND`` descriptor. Once the call
returns the line is in the kernel's page cache: it survives the death of this process (even
SIGKILL), which is the failure this file is for. A failed or short write is reported (the
caller keeps the record in memory until it is committed) and the journal is marked ``broken``
until the next segment starts; a torn line is ended, and skipped and counted on reading.

Without fsync, a power loss or kernel crash can lose the last lines written since the OS last
flushed them; that is not covered (fsync per request would cost milliseconds).

A new segment starts when the old one has grown (``rotate``): it first repeats the start
records of the requests still in flight, so an old segment may be deleted as soon as every end
and event in it is committed to the store, without losing the evidence of what was in flight.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opod.http import fastjson

log = logging.getLogger("opod.ledger")

FORMAT = "opod-ledger"
VERSION = 1
_SEGMENT = re.compile(r"^journal-(\d{6,})\.jsonl$")


class JournalError(Exception):
    """The journal directory cannot be used; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Line:
    segment: Path
    number: int  # 1-based, for messages
    record: dict[str, Any]


def _number(segment: Path) -> int:
    match = _SEGMENT.match(segment.name)
    return int(match.group(1)) if match else 0


encode = fastjson.line
"""One journal line: compact JSON, UTF-8 (text with lone surrogates is escaped instead); TypeError for a
value JSON cannot hold. The function itself, not a wrapper: two lines are written for every request."""


class Journal:
    def __init__(self, directory: Path, lock_fd: int) -> None:
        """Use :meth:`open`."""
        self.directory = directory
        self._lock_fd = lock_fd
        self._fd: int | None = None  # the active segment
        self._number = 0  # its number
        self.size = 0  # bytes written to the active segment
        self.broken = False  # the last write failed; rotate() tries a fresh segment
        self.bad_lines = 0  # lines skipped by read(): torn or not JSON

    @classmethod
    def open(cls, directory: Path) -> Journal:
        """Take the directory for this process; JournalError when another live process holds it."""
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise JournalError(
                f"cannot use the ledger directory {directory}: {err.strerror}; make it writable or set OPOD_HOME elsewhere"
            ) from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(lock_fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise JournalError(
                    f"another running opod leader uses the ledger in {directory}; stop it, or give this one its own OPOD_HOME"
                ) from None
            raise JournalError(f"cannot lock {directory / 'lock'}: {err.strerror}") from None
        return cls(directory, lock_fd)

    def segments(self) -> list[Path]:
        """The segment files, oldest first."""
        return sorted((path for path in self.directory.iterdir() if _SEGMENT.match(path.name)), key=_number)

    def read(self) -> Iterator[Line]:
        """Every record of every segment, in order. Lines that do not parse are counted and skipped.

        A segment written by a newer journal version raises JournalError: guessing its meaning
        could turn rows into duplicates or drop them.
        """
        for segment in self.segments():
            with segment.open("rb") as handle:
                for number, raw in enumerate(handle, start=1):
                    if raw.endswith(b"\0"):
                        # Room reserved and never written: the segment's end.
                        raw = raw.rstrip(b"\0")
                        if not raw:
                            continue
                    try:
                        record = fastjson.loads(raw)
                    except ValueError:
                        record = None
                    if not isinstance(record, dict):
                        # A torn last line (power loss, a kill mid-write) or a short write; the rest is still good.
                        self.bad_lines += 1
                        log.error("ledger journal %s line %d is not a record; skipped", segment, number)
                        continue
                    if record.get("journal") == FORMAT:
                        version = record.get("version")
                        if version != VERSION:
                            raise JournalError(
                                f"{segment} was written by journal version {version!r}, this opod reads version {VERSION}; "
                                "run the opod that wrote it (or newer) until it has replayed it"
                            )
                        continue
                    yield Line(segment, number, record)

    def rotate(self, header: dict[str, Any], carried: list[bytes]) -> list[Path]:
        """Start segment n+1 (header, then ``carried`` lines) and write there from now on.

        Returns the older segments: delete them once every end and event written in them is
        committed. The new file is complete before it becomes the active one; if it cannot be
        made, the current segment stays active and OSError propagates.
        """
        listed = self.segments()
        number = max([self._number, *(_number(path) for path in listed)]) + 1
        data = encode(header) + b"".join(carried)
        fd = _written(self.directory / f"journal-{number:06d}.jsonl", data)
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._number, self.size, self.broken = fd, number, len(data), False
        return [path for path in listed if _number(path) < number]

    def append(self, line: bytes) -> bool:
        """Write one line; False when it could not be written whole (the caller keeps the record)."""
        if self._fd is None:
            self._failed("the journal is closed")
            return False
        try:
            written = os.write(self._fd, line)
        except OSError as err:
            self._failed(f"{err.strerror}")
            return False
        self.size += written
        if written != len(line):
            # End the torn line, so the next record starts on a line of its own.
            try:
                self.size += os.write(self._fd, b"\n")
            except OSError:
                pass
            self._failed(f"only {written} of {len(line)} bytes written (disk full?)")
            return False
        return True

    def _failed(self, why: str) -> None:
        if not self.broken:
            log.error(
                "LEDGER JOURNAL WRITE FAILED in %s: %s. Usage is kept in memory until it is committed, "
                "but a crash now would lose it; free disk space or fix the directory",
                self.directory,
                why,
            )
        self.broken = True

    def close(self) -> None:
        """Close the active segment and release the directory."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1


def _written(path: Path, data: bytes) -> int:
    """A new segment holding ``data``, appended to with ``os.write``: its descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write to {path}")
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd
