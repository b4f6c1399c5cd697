"""A model's origin against its repository's latest commit: what changed, what is missing, what an update fetches."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from opod.contract.admin.catalog import CatalogOrigin, CatalogOriginFile
from opod.control.update_checks import Latest, back, compare, found_origin, moved
from opod.weights.choose import HubFile

AT = datetime(2026, 12, 4, tzinfo=UTC)
REPO = "acme/tiny-GGUF"
OLD = HubFile("tiny-Q4_K_M.gguf", 1000, "a" * 64)
NEW = HubFile("tiny-Q4_K_M.gguf", 1200, "b" * 64)
README = HubFile("README.md", 10, None, "c" * 40)


def origin(*files: HubFile, revision: str = "1" * 40) -> CatalogOrigin:
    return CatalogOrigin(
        repo=REPO,
        revision=revision,
        files=[CatalogOriginFile(path=f.path, sha256=f.sha256, bytes=f.size) for f in files],
    )


def latest(*files: HubFile, revision: str = "2" * 40) -> Latest:
    return Latest(REPO, revision, {f.path: f for f in files})


def test_a_commit_that_leaves_the_weights_alone_is_no_update() -> None:
    info = compare("tiny", origin(OLD), latest(OLD, README), AT)
    assert info.available is False and info.changed is None and info.bytes == 0 and info.latest == "2" * 40


def test_changed_weights_are_an_update_that_fetches_their_bytes() -> None:
    info = compare("tiny", origin(OLD), latest(NEW, README), AT)
    assert info.available is True and info.changed == ["tiny-Q4_K_M.gguf"] and info.bytes == 1200
    assert info.current == "1" * 40 and info.checked_at == AT and info.error is None


def test_a_file_the_latest_commit_lost_makes_it_unavailable_and_says_why() -> None:
    info = compare("tiny", origin(OLD), latest(README), AT)
    assert info.available is False and info.missing == ["tiny-Q4_K_M.gguf"]
    assert info.error is not None and "no longer has tiny-Q4_K_M.gguf" in info.error


def test_an_update_keeps_what_it_replaced_and_a_rollback_returns_to_it() -> None:
    source, new, artifact = moved(origin(OLD), f"{REPO}/tiny-Q4_K_M.gguf", latest(NEW))
    assert source == f"{REPO}/tiny-Q4_K_M.gguf" and new.revision == "2" * 40 and artifact.files == (NEW,)
    assert new.previous is not None and new.previous.revision == "1" * 40
    assert new.files is not None and new.files[0].sha256 == NEW.sha256
    again, old, fetched = back(new, source)
    assert again == source and old.revision == "1" * 40 and fetched.files[0].sha256 == OLD.sha256
    assert old.previous is not None and old.previous.revision == "2" * 40, "a rollback can itself be undone"


def test_weights_added_by_hand_are_found_by_digest_or_by_name(tmp_path: Path) -> None:
    local = tmp_path / "tiny-Q4_K_M.gguf"
    local.write_bytes(b"weights")
    digest = hashlib.sha256(b"weights").hexdigest()
    same = HubFile("sub/tiny-Q4_K_M.gguf", 7, digest)
    found = found_origin(REPO, str(local), latest(same))
    assert found.revision == "2" * 40 and found.files == [CatalogOriginFile(path=same.path, sha256=digest, bytes=7)]
    other = found_origin(REPO, str(local), latest(NEW))
    assert other.revision is None and other.files is not None and other.files[0].sha256 == digest
    assert compare("hand", other, latest(NEW), AT).available is True, "its digest differs from the latest's"
    with pytest.raises(ValueError, match="has no file 'tiny-Q4_K_M.gguf'"):
        found_origin(REPO, str(local), latest(README))
