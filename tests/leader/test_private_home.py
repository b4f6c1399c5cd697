"""The leader's home is its own: other local users read no secret and no client's data in it.

The home is 0700; the store (``opod.db`` and its WAL and shared-memory files), the admin key, the
node secret, the secrets key and the ledger's files are 0600 from the moment they exist, and a
looser mode found at start is made private again, with a warning naming the file. A secret kept in
the store (the SCIM token) is sealed with the key in the home: the database file never holds it in
clear, and the leader still reads it.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from opod.security.private import tighten
from tests.control.scim_support import scim
from tests.support.inprocess import InProcessLeader

TOKEN = "scim-tok-never-in-clear-4f1a9c"
PRIVATE_FILES = ("opod.db", "opod.db-wal", "opod.db-shm", "admin.key", "node-secret", "secrets.key")


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """A process umask as a user's shell would have it (022 makes files readable by every local user)."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes(home: Path) -> dict[str, str]:
    found = {".": oct(mode(home))}
    for path in home.rglob("*"):
        if path.is_dir() or path.name in PRIVATE_FILES or path.parent.name == "ledger":
            found[str(path.relative_to(home))] = oct(mode(path))
    return found


def database_bytes(home: Path) -> bytes:
    """Every byte of the store as it is on disk: the database file, its WAL and its shared memory."""
    files = [home / name for name in ("opod.db", "opod.db-wal", "opod.db-shm")]
    return b"".join(path.read_bytes() for path in files if path.exists())


def test_the_home_the_store_and_the_key_files_are_private_and_a_secret_is_sealed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with umask(0o022):
        leader = InProcessLeader(home)
        try:
            status, body = leader.admin("PUT", "/api/v1/auth/secrets/scim-token", {"value": TOKEN})
            assert status == 200, body
            assert scim(leader, "GET", "/Users", token=TOKEN)[0] == 200, "the leader reads the sealed token"
            assert scim(leader, "GET", "/Users", token="not-it")[0] == 401
            found = modes(home)
            assert database_bytes(home).find(TOKEN.encode()) == -1, "the SCIM token is in the database file in clear"
        finally:
            leader.stop()
    for name in PRIVATE_FILES:
        assert found.get(name) == "0o600", f"{name}: {found}"
    assert found["."] == "0o700" and found["ledger"] == "0o700", found
    assert all(value in ("0o600", "0o700") for value in found.values()), found
    assert database_bytes(home).find(TOKEN.encode()) == -1, "the SCIM token is in the database file in clear"


def test_a_home_found_readable_by_others_is_made_private_at_start_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    with umask(0o022):
        InProcessLeader(home).stop()
        home.chmod(0o755)
        for name in ("opod.db", "admin.key", "node-secret", "secrets.key"):
            (home / name).chmod(0o644)
        (home / "ledger").chmod(0o755)
        with caplog.at_level(logging.WARNING):
            leader = InProcessLeader(home)
        try:
            found = modes(home)
        finally:
            leader.stop()
    assert found["."] == "0o700" and found["ledger"] == "0o700", found
    for name in ("opod.db", "admin.key", "node-secret", "secrets.key"):
        assert found[name] == "0o600", found
        assert f"{home / name} was readable by other users (mode 0644); made 0600" in caplog.text, caplog.text
    assert f"{home} was open to other users (mode 0755); made 0700" in caplog.text, caplog.text


def test_a_file_that_cannot_be_narrowed_is_named_and_the_rest_still_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared, admin = tmp_path / "shared.key", tmp_path / "admin.key"
    for path in (shared, admin):
        path.write_text("k")
        path.chmod(0o644)
    chmod = os.chmod

    def read_only_mount(path: Path, mode: int) -> None:  # a key mounted read-only, as a shared secret often is
        if Path(path) == shared:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        chmod(path, mode)

    monkeypatch.setattr(os, "chmod", read_only_mount)
    lines = tighten([shared, admin, tmp_path / "gone"])
    assert lines == [
        f"{shared} is readable by other users (mode 0644) and cannot be made 0600: Read-only file system",
        f"{admin} was readable by other users (mode 0644); made 0600",
    ]
    assert mode(admin) == 0o600
