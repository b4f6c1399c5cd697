"""Files only their owner reads: the leader's home (0700) and each file in it that holds a secret or a client's data (0600).

Such a file is created with its private mode (never written first and narrowed after), and
:func:`tighten` narrows any found looser at start, saying which: a home made by an older opod,
copied with ``cp -r``, or restored from a backup keeps the modes it came with.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """``path`` and its missing parents as directories; a directory this creates is 0700."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def create_private(path: Path) -> None:
    """Create ``path`` empty and 0600 when it does not exist (a file another program fills keeps that mode)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` whole, 0600 from its first byte: a new file beside it, then renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def tighten(paths: Iterable[Path]) -> list[str]:
    """Take every permission of group and others off the ``paths`` that exist (a home 0755 becomes 0700, a file 0644 0600).

    Returns one line for each path found looser, naming it, its mode before and what was done; a path
    that is gone is skipped.
    """
    changed = []
    for path in paths:
        try:
            found = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(found.st_mode):
            continue  # the mode of a link is not the target's; the target is named on its own when it matters
        before = stat.S_IMODE(found.st_mode)
        if not before & 0o077:
            continue
        after = before & 0o700  # the owner keeps what it had
        what = "open to" if stat.S_ISDIR(found.st_mode) else "readable by"
        try:
            os.chmod(path, after)
        except OSError as err:  # a read-only mount of a shared key, another user's file: say so, start anyway
            changed.append(
                f"{path} is {what} other users (mode {before:04o}) and cannot be made {after:04o}: {err.strerror}"
            )
            continue
        changed.append(f"{path} was {what} other users (mode {before:04o}); made {after:04o}")
    return changed
