"""The plan file: the one model (and its adapters) an endpoint serves, and what /loadz shows of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opod.access.service import AccessService
from opod.http.errors import GatewayError
from opod.snapshots.plan import PlanFile
from opod.snapshots.service import SnapshotPaths, Snapshots
from opod.snapshots.watch import SnapshotError
from tests.snapshots.helpers import Events, eventually, write_atomic


def test_without_a_plan_nothing_is_refused() -> None:
    plan = PlanFile()
    assert plan.current() is None and plan.loadz() == (0, "") and plan.served_models() is None
    assert plan.allows("anything")
    plan.check_model("anything")


def test_a_plan_serves_its_model_and_declared_adapters_only() -> None:
    plan = PlanFile()
    plan.apply(plan.parse(b'{"revision": 7, "model": "qwen3-8b", "adapters": ["sql", "legal"], "floor": 1, "max": 4}'))
    assert plan.loadz() == (7, "qwen3-8b")
    assert plan.served_models() == {"qwen3-8b", "qwen3-8b:sql", "qwen3-8b:legal"}
    assert plan.allows("qwen3-8b:sql") and not plan.allows("qwen3-8b:poetry") and not plan.allows("llama-3.1-8b")
    with pytest.raises(GatewayError) as caught:
        plan.check_model("qwen3-8b:poetry")
    assert caught.value.status == 404 and caught.value.code == "model_not_found"
    assert "qwen3-8b:legal, qwen3-8b:sql" in caught.value.message
    current = plan.current()
    assert current is not None and (current.floor, current.max) == (1, 4)


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        ({"revision": 1}, "model: empty"),
        ({"revision": 1, "model": "a:b"}, "model: 'a:b' holds ':'"),
        ({"revision": -1, "model": "m"}, "revision: -1"),
        ({"revision": "1", "model": "m"}, "revision: expected an integer"),
        ({"model": "m", "adapters": ["x", "x"]}, "adapters[1]: 'x' is listed twice"),
        ({"model": "m", "adapters": ["a:b"]}, "adapters[0]"),
        ({"model": "m", "floor": 3, "max": 2}, "floor: 3 is above max 2"),
        ({"model": "m", "max": -1}, "max: -1"),
    ],
)
def test_a_bad_plan_names_the_field(plan: dict, field: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        PlanFile().parse(json.dumps(plan).encode())
    assert field in str(caught.value)


async def test_the_plan_is_watched_and_a_bad_one_keeps_the_last_good(tmp_path: Path, access: AccessService) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, {"revision": 1, "model": "qwen3-8b"})
    events = Events()
    snaps = Snapshots(access, events, paths=SnapshotPaths(plan=path))
    await snaps.start()
    try:
        assert snaps.plan.loadz() == (1, "qwen3-8b")
        write_atomic(path, {"revision": 2, "model": "qwen3-8b", "adapters": ["sql"]})
        assert await eventually(lambda: snaps.plan.loadz()[0] == 2) < 2.0
        write_atomic(path, {"revision": 3, "model": ""})
        await eventually(lambda: events.of("plan.rejected"))
        assert snaps.plan.loadz() == (2, "qwen3-8b") and snaps.plan.allows("qwen3-8b:sql")
        assert snaps.status()["plan"] == {
            "path": str(path),
            "revision": "2",
            "error": events.of("plan.rejected")[0]["reason"],
        }
    finally:
        await snaps.stop()
