"""File helpers shared by every weights source: atomic placement, digests, cross-process locks.

A weights file appears under its final name only once it is complete and
verified, so a crash or a refused download never leaves something a later run
would mistake for good weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

Progress = Callable[[int, "int | None"], None]
"""Called with (bytes done, total bytes or None when unknown)."""

CHUNK = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(text: str | None) -> bool:
    return text is not None and _HEX64.match(text) is not None


def normalize_sha256(value: str | None, field: str) -> str | None:
    """A pinned digest in canonical form (64 lowercase hex), ``None`` for not pinned."""
    if value is None or not value.strip():
        return None
    text = value.strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:") :]
    if not is_sha256(text):
        raise ValueError(f"{field}: {value!r} is not a SHA-256 (64 hex characters)")
    return text


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            done += len(block)
            if progress:
                progress(done, total)
    return digest.hexdigest()


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A temporary name in the same directory, so the final rename stays on one filesystem."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{time.monotonic_ns()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it becomes ``path`` in one rename, on failure it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def record_digest(path: Path, digest: str) -> None:
    """Remember a verified digest beside the file, so a cache hit need not re-read gigabytes."""
    stat = path.stat()
    with atomic_path(_record_path(path)) as tmp:
        tmp.write_text(f"{digest}  {stat.st_size}  {stat.st_mtime_ns}\n", encoding="ascii")


def known_digest(path: Path) -> str:
    """The file's SHA-256: from its record when the file is unchanged since, else computed (and recorded)."""
    try:
        digest, size, mtime = _record_path(path).read_text(encoding="ascii").split()
        stat = path.stat()
        if is_sha256(digest) and int(size) == stat.st_size and int(mtime) == stat.st_mtime_ns:
            return digest
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    with contextlib.suppress(OSError):
        record_digest(path, digest)
    return digest


def remove_with_record(path: Path) -> None:
    path.unlink(missing_ok=True)
    _record_path(path).unlink(missing_ok=True)


@contextlib.contextmanager
def file_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<target>.lock`` so two processes never fetch the same file at once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.asynccontextmanager
async def async_file_lock(target: Path, poll_s: float = 0.1) -> AsyncIterator[None]:
    """:func:`file_lock` for the event loop: polls instead of blocking the loop's thread."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    with lock.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(poll_s)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
