"""The ledger's append-only journal: what makes a usage row survive a crash before its commit.

Files live in ``<home>/ledger/``:

- ``lock``: held with ``flock`` by the one ledger using this directory. The kernel drops it when
  the process dies (even by SIGKILL), so a crashed leader never blocks its successor, while a
  second live leader on the same home is refused instead of turning the first one's requests in
  flight into ``interrupted`` rows.
- ``journal-<n>.jsonl``: segments, oldest first. Each line is one JSON object ending in ``\\n``:
  a header ``{"journal": "opod-ledger", "version": 1, "boot": …, "ts_us": …}`` opening the
  segment, then records (``"rec": "start" | "end" | "event"``, see ``records.py``). A segment may
  end in NUL bytes: room reserved for lines that were never written. Readers skip them.

Appending a record copies its line into the active segment, mapped into memory (``MAP_SHARED``)
with its space reserved up front (``posix_fallocate``). Once the copy ends the line is in the
kernel's page cache, as after a returned ``write``: it survives the death of this process (even
SIGKILL), which is the failure this file is for. The copy makes no system call, so the request
path neither pays for one nor hands the GIL to the writer thread. A line that does not fit starts
a new segment; ``close`` cuts the active segment to the length used. A writer that died leaves
NUL padding after its last line, and one killed mid-copy a torn line, skipped and counted.

Without fsync, a power loss or kernel crash can lose the last lines written since the OS last
flushed them; that is not covered (fsync per request would cost milliseconds).

Segments are mapped only on filesystems that write a reserved block without allocating
(``MAPPABLE``). Elsewhere (btrfs, ZFS, NFS, overlay) a write into a mapping can need space the disk
no longer has, and the kernel answers with SIGBUS, which ends the process, not with an error. There,
and when the reservation fails (a full disk), each record is one ``os.write`` on an ``O_APPEND``
descriptor: the same guarantee, and a failed write is reported while the record stays in memory.
A mapped segment that fails under the leader (a dying disk, truncated by another process) ends it
with SIGBUS; the next start replays what reached the page cache.

A new segment starts when the old one has grown (``rotate``): it first repeats the start
records of the requests still in flight, so an old segment may be deleted as soon as every end
and event in it is committed to the store, without losing the evidence of what was in flight.
Reserving, writing and mapping the next segment (``prepare``) and unmapping the old one
(``release``) take milliseconds; the running ledger does them in a thread, so the event loop's
share of a rotation is copying the starts in flight (about 0.3 ms).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opod.http import fastjson

log = logging.getLogger("opod.ledger")

FORMAT = "opod-ledger"
VERSION = 1
_SEGMENT = re.compile(r"^journal-(\d{6,})\.jsonl$")
MAPPABLE = frozenset({"ext4", "xfs", "tmpfs"})
"""Filesystems whose reserved (fallocated) blocks take writes through a mapping without allocating."""


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


def encode(record: dict[str, Any]) -> bytes:
    """One journal line: compact JSON, UTF-8 (text with lone surrogates is escaped instead)."""
    return fastjson.line(record)


def filesystem(directory: Path) -> str:
    """The type of the filesystem holding ``directory`` (``"ext4"``, …), or "" when unknown."""
    try:
        device = os.stat(directory).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            mounts = handle.read().splitlines()
    except OSError:
        return ""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    for mount in mounts:
        # id parent major:minor root mount-point options [optional fields] - type source options
        fields = mount.split(" ")
        if len(fields) > 8 and fields[2] == wanted and "-" in fields[6:]:
            return fields[fields.index("-", 6) + 1]
    return ""


class Journal:
    def __init__(self, directory: Path, lock_fd: int, reserve: int) -> None:
        """Use :meth:`open`."""
        self.directory = directory
        self.reserve = reserve  # bytes a mapped segment reserves; 0: appends with os.write
        self._lock_fd = lock_fd
        self._fd: int | None = None
        self._view: mmap.mmap | None = None  # the active segment, when mapped
        self._capacity = 0  # its reserved bytes
        self._header = b""  # the active boot's header, opening a segment started by a full one
        self._retired: list[tuple[int, mmap.mmap | None]] = []  # replaced segments, for release()
        self._number = 0
        self._allocated = 0  # the highest segment number handed out
        self._numbers = threading.Lock()  # prepare() takes a number in a thread, a spill on the loop
        self.size = 0  # bytes used in the active segment
        self.broken = False  # the last write failed; rotate() tries a fresh segment
        self.bad_lines = 0  # lines skipped by read(): torn or not JSON

    @property
    def mapped(self) -> bool:
        """Whether the active segment is appended to by copying into its mapping."""
        return self._view is not None

    @classmethod
    def open(cls, directory: Path, *, reserve: int = 0) -> Journal:
        """Take the directory for this process; JournalError when another live process holds it.

        ``reserve``: the bytes each segment reserves and maps, where the filesystem allows it
        (``MAPPABLE``); 0, or another filesystem, appends with ``os.write``.
        """
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise JournalError(f"cannot use the ledger directory {directory}: {err.strerror}; make it writable or set OPOD_HOME elsewhere") from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(lock_fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise JournalError(
                    f"another running opod leader uses the ledger in {directory}; stop it, or give this one its own OPOD_HOME"
                ) from None
            raise JournalError(f"cannot lock {directory / 'lock'}: {err.strerror}") from None
        if reserve > 0 and filesystem(directory) not in MAPPABLE:
            reserve = 0
        return cls(directory, lock_fd, max(reserve, 0))

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
                        # Room a mapped writer reserved and never wrote: the segment's end.
                        raw = raw.rstrip(b"\0")
                        if not raw:
                            continue
                    try:
                        record = fastjson.loads(raw)
                    except ValueError:
                        record = None
                    if not isinstance(record, dict):
                        # A torn last line (power loss, a kill mid-copy) or a short write; the rest is still good.
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

    def rotate(self, header: dict[str, Any], carried: list[bytes], spare: Spare | None = None) -> list[Path]:
        """Start segment n+1 (header, then ``carried`` lines) and write there from now on.

        Returns the older segments: delete them once every end and event written in them is
        committed. The new file is complete before it becomes the active one; if it cannot be
        made, the current segment stays active and OSError propagates. ``spare`` (from
        :meth:`prepare`) is used when it still fits; the replaced segment's mapping is then left
        for :meth:`release` instead of being unmapped here.
        """
        head = encode(header)
        data = head + b"".join(carried)
        listed = self.segments()
        if spare is not None and spare.number > self._number and len(data) <= spare.capacity:
            spare.view[: len(data)] = data
            self._activate(spare.fd, spare.view, spare.capacity, spare.number, len(data))
        else:
            if spare is not None:
                spare.discard()
            self._start(self._allocate(listed), data, written=True)
        self._header = head
        return [path for path in listed if _number(path) < self._number]

    def prepare(self) -> Spare | None:
        """The next segment, reserved and mapped ahead of :meth:`rotate`, which then only copies into it.

        Reserving and unmapping take milliseconds, so the ledger calls this and :meth:`release`
        from a thread: the event loop's share of a rotation is a copy. None where segments are
        not mapped, or the reservation fails (rotate makes one itself then). It reads the active
        segment's number only.
        """
        if not self.reserve:
            return None
        number = self._allocate(self.segments())
        path = self.directory / f"journal-{number:06d}.jsonl"
        try:
            fd, view, capacity = _mapped(path, b"", self.reserve, written=True)
        except OSError:
            return None
        return Spare(number, path, fd, view, capacity)

    def _allocate(self, listed: Iterable[Path] = ()) -> int:
        """A segment number no one has used: above every one handed out (the active one too) and ``listed``.

        A spill on the loop may start a segment while :meth:`prepare` makes one in a thread; with
        one number each, neither finds the other's file, and the spare then goes unused."""
        with self._numbers:
            self._allocated = max([self._allocated, *(_number(path) for path in listed)]) + 1
            return self._allocated

    @property
    def unreleased(self) -> bool:
        """Replaced segments wait for :meth:`release`."""
        return bool(self._retired)

    def release(self) -> None:
        """Unmap and close the segments replaced by a newer one (call it from a thread)."""
        while self._retired:
            fd, view = self._retired.pop(0)  # one at a time: a spill on the loop may add one meanwhile
            if view is not None:
                view.close()
            os.close(fd)

    def _activate(self, fd: int, view: mmap.mmap | None, capacity: int, number: int, size: int) -> None:
        """Make a new segment the active one; the one it replaces waits for :meth:`release`
        (unmapping takes a millisecond or more, so not on the request path)."""
        if self._fd is not None:
            self._retired.append((self._fd, self._view))
        self._fd, self._view, self._capacity, self._number, self.size, self.broken = fd, view, capacity, number, size, False

    def append(self, line: bytes) -> bool:
        """Write one line; False when it could not be written whole (the caller keeps the record)."""
        view = self._view
        if view is not None:
            end = self.size + len(line)
            if end <= self._capacity:
                view[self.size : end] = line
                self.size = end
                return True
            return self._spill(line)
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

    def _spill(self, line: bytes) -> bool:
        # The full segment stays until the next rotate() lists it with the older ones.
        if self.broken:
            return False  # the writer's next rotate() tries again, not every request meanwhile
        try:
            self._start(self._allocate(), self._header + line)
        except OSError as err:
            self._failed(f"cannot start a new segment: {err.strerror}")
            return False
        return True

    def _start(self, number: int, data: bytes, *, written: bool = False) -> None:
        """Make segment ``number``, holding ``data``, the active one; OSError leaves the old one active.

        ``written`` as in :func:`_mapped`: not for a segment started on the request path (a spill).
        """
        path = self.directory / f"journal-{number:06d}.jsonl"
        view = None
        if self.reserve:
            try:
                fd, view, capacity = _mapped(path, data, self.reserve, written=written)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    log.warning("ledger: cannot map journal segments in %s (%s); appending with write() instead",
                                self.directory, err.strerror)
                    self.reserve = 0
        if view is None:
            fd, capacity = _written(path, data), 0
        self._activate(fd, view, capacity, number, len(data))

    def _failed(self, why: str) -> None:
        if not self.broken:
            log.error(
                "LEDGER JOURNAL WRITE FAILED in %s: %s. Usage is kept in memory until it is committed, "
                "but a crash now would lose it; free disk space or fix the directory",
                self.directory, why,
            )
        self.broken = True

    def close(self) -> None:
        """Release every segment; the active one is cut to the length used."""
        if self._view is not None:
            self._view.close()
            self._view = None
            try:
                os.ftruncate(self._fd, self.size)
            except OSError as err:
                log.warning("ledger: cannot cut the journal segment %06d to its length: %s", self._number, err.strerror)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.release()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1


@dataclass(slots=True)
class Spare:
    """A segment made by :meth:`Journal.prepare`: reserved and mapped, nothing written yet."""

    number: int
    path: Path
    fd: int
    view: mmap.mmap
    capacity: int

    def discard(self) -> None:
        self.view.close()
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def _mapped(path: Path, data: bytes, reserve: int, *, written: bool = False) -> tuple[int, mmap.mmap, int]:
    """A new segment holding ``data``, its room reserved and mapped: (descriptor, mapping, capacity).

    ``written``: also write the room with zeros (tens of milliseconds, without the GIL). A first write
    through the mapping into a reserved but never written block makes the filesystem convert it, about
    0.15 ms a page; into a written one it costs a plain page fault.
    """
    capacity = -(-max(reserve, len(data)) // mmap.PAGESIZE) * mmap.PAGESIZE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, capacity)  # blocks allocated now: a page write later cannot find the disk full
        if written:
            os.pwrite(fd, bytes(capacity), 0)
        view = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view[: len(data)] = data
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd, view, capacity


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
