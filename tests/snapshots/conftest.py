"""The access service every snapshot test applies files through: the leader's own, over a SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.access.service import AccessService
from tests.snapshots.helpers import open_access


@pytest.fixture
def access(tmp_path: Path) -> Iterator[AccessService]:
    service = open_access(tmp_path / "leader")
    yield service
    service.store.close()
