"""Shared fixtures. ``../shared`` (the specs beside the clone) is read-only input for tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared() -> Path:
    if not (SHARED / "opod-sdk" / "CONTRACT.md").is_file():
        pytest.skip(f"the shared specs are not beside this clone ({SHARED}); golden and spec tests need them")
    return SHARED


@pytest.fixture(scope="session")
def testdata(shared: Path) -> Path:
    return shared / "opod-sdk" / "testdata"
