"""The watcher: a file applied within 2 s of appearing or changing, kept when it breaks or disappears."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opod.snapshots.plan import PlanFile
from opod.snapshots.service import SnapshotPaths
from opod.snapshots.watch import (
    DEFAULT_AUTH_FILE,
    DEFAULT_POLICY_FILE,
    FileWatcher,
    resolve,
)
from tests.snapshots.helpers import Events, eventually, write_atomic


def plan(revision: int, model: str = "qwen3-8b") -> dict:
    return {"revision": revision, "model": model}


async def test_a_file_that_appears_after_start_is_applied_within_2_s(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    await watcher.start()
    try:
        assert holder.current() is None and events.items == []  # absent at start: not news, keep looking
        write_atomic(path, plan(3))
        took = await eventually(lambda: holder.current() is not None)
        assert took < 2.0
        assert holder.loadz() == (3, "qwen3-8b")
        assert events.of("plan.updated") == [
            {
                "path": str(path),
                "revision": "3",
                "model": "qwen3-8b",
                "adapters": [],
                "floor": 0,
                "max": 0,
                "previous_revision": None,
            }
        ]
    finally:
        await watcher.stop()


async def test_atomic_replacement_and_in_place_writes_both_apply(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, plan(1))
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    await watcher.start()
    try:
        assert holder.loadz() == (1, "qwen3-8b")  # applied before start() returns
        write_atomic(path, plan(2))
        assert await eventually(lambda: holder.loadz()[0] == 2) < 2.0
        path.write_text('{"revision": 4, "model": "qwen3-14b"}')  # same inode, rewritten in place
        assert await eventually(lambda: holder.loadz() == (4, "qwen3-14b")) < 2.0
        assert [e["revision"] for e in events.of("plan.updated")] == ["1", "2", "4"]
        assert events.of("plan.updated")[-1]["previous_revision"] == "2"
    finally:
        await watcher.stop()


def test_a_touch_without_new_content_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, plan(1))
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    assert watcher.poll() == "updated"
    os.utime(path, ns=(1, 1))
    assert watcher.poll() is None
    write_atomic(path, plan(1))  # same bytes, new inode
    assert watcher.poll() is None
    assert events.types() == ["plan.updated"]


def test_a_malformed_version_keeps_the_last_good_and_says_which_field(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, plan(1))
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    watcher.poll()
    write_atomic(path, {"revision": "two", "model": "qwen3-8b"})
    assert watcher.poll() == "rejected"
    assert holder.loadz() == (1, "qwen3-8b")
    rejected = events.of("plan.rejected")[-1]
    assert "revision: expected an integer, got a string" in rejected["reason"]
    assert rejected["kept_revision"] == "1" and rejected["path"] == str(path)
    assert watcher.last_error == rejected["reason"]
    assert watcher.poll() is None  # the same bad content is reported once
    write_atomic(path, "{not json")
    assert watcher.poll() == "rejected"
    assert "not valid JSON" in events.of("plan.rejected")[-1]["reason"]
    write_atomic(path, plan(2))
    assert watcher.poll() == "updated" and watcher.last_error is None


def test_a_file_that_disappears_keeps_the_last_good_and_says_so_once(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, plan(5))
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    watcher.poll()
    path.unlink()
    assert watcher.poll() == "missing"
    assert watcher.poll() is None
    assert holder.loadz() == (5, "qwen3-8b")
    missing = events.of("plan.rejected")
    assert len(missing) == 1 and missing[0]["missing"] is True
    assert "disappeared" in missing[0]["reason"] and "keeping revision '5'" in missing[0]["reason"]
    write_atomic(path, plan(6))
    assert watcher.poll() == "updated" and holder.loadz()[0] == 6


def test_new_content_under_the_old_revision_is_applied_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_atomic(path, plan(1))
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    watcher.poll()
    write_atomic(path, plan(1, "qwen3-14b"))
    assert watcher.poll() == "updated" and holder.loadz() == (1, "qwen3-14b")
    assert "change the revision" in events.of("plan.updated")[-1]["note"]


async def test_a_failing_event_sink_does_not_stop_the_watcher(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    holder = PlanFile()

    def broken(*_: object) -> None:
        raise RuntimeError("sink down")

    watcher = FileWatcher(path, holder, broken)
    await watcher.start()
    try:
        write_atomic(path, plan(1))
        await eventually(lambda: holder.loadz()[0] == 1)
        write_atomic(path, plan(2))
        await eventually(lambda: holder.loadz()[0] == 2)
    finally:
        await watcher.stop()


def test_paths_follow_the_environment_contract(tmp_path: Path) -> None:
    mine = tmp_path / "a.json"
    assert resolve("OPOD_AUTH_FILE", DEFAULT_AUTH_FILE, environ={"OPOD_AUTH_FILE": "off"}) is None
    assert resolve("OPOD_AUTH_FILE", DEFAULT_AUTH_FILE, environ={"OPOD_AUTH_FILE": " OFF "}) is None
    assert resolve("OPOD_AUTH_FILE", DEFAULT_AUTH_FILE, environ={}) == DEFAULT_AUTH_FILE
    assert resolve("OPOD_AUTH_FILE", DEFAULT_AUTH_FILE, environ={"OPOD_AUTH_FILE": str(mine)}) == mine
    # The plan's default path is watched only when it is there; an explicit one always.
    absent = tmp_path / "no-plan.json"
    assert resolve("OPOD_PLAN_FILE", absent, only_if_present=True, environ={}) is None
    absent.write_text("{}")
    assert resolve("OPOD_PLAN_FILE", absent, only_if_present=True, environ={}) == absent
    assert resolve("OPOD_PLAN_FILE", absent, only_if_present=True, environ={"OPOD_PLAN_FILE": str(mine)}) == mine
    paths = SnapshotPaths.from_env({"OPOD_AUTH_FILE": str(mine), "OPOD_POLICY_FILE": "off"})
    assert paths.auth == mine and paths.policy is None
    assert SnapshotPaths.from_env({}).policy == DEFAULT_POLICY_FILE


@pytest.mark.parametrize("content", [b"", b"\xff\xfe", b"[]", b"null"])
def test_files_that_are_not_an_object_are_refused_plainly(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    events, holder = Events(), PlanFile()
    assert FileWatcher(path, holder, events).poll() == "rejected"
    reason = events.of("plan.rejected")[0]["reason"]
    assert reason.startswith("plan file: ")
    assert any(word in reason for word in ("empty", "UTF-8", "expected a JSON object"))


def test_a_file_back_with_content_already_refused_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    events, holder = Events(), PlanFile()
    watcher = FileWatcher(path, holder, events)
    write_atomic(path, plan(1))
    watcher.poll()
    write_atomic(path, {"model": ""})
    watcher.poll()
    reason = watcher.last_error
    path.unlink()
    watcher.poll()
    write_atomic(path, {"model": ""})
    assert watcher.poll() is None and watcher.last_error == reason and holder.loadz()[0] == 1


def test_a_huge_file_is_refused_without_being_read(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    with open(path, "wb") as handle:
        handle.truncate(17 << 20)  # sparse: costs no disk
    events = Events()
    assert FileWatcher(path, PlanFile(), events).poll() == "rejected"
    assert "more than the 16 MiB" in events.of("plan.rejected")[0]["reason"]
