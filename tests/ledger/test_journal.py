"""The journal's segments: mapped with room reserved where the filesystem allows it, written with
os.write elsewhere, and read back the same way whichever wrote them (or an older opod did)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from opod.ledger import Ledger, journal
from opod.ledger import ledger as ledger_module
from opod.ledger.journal import Journal
from opod.store import Store
from tests.ledger.conftest import request

# A leader that journals 30 ends, 20 starts still in flight and two events in 8 KiB segments (so
# full ones start new ones), commits nothing, and waits to be killed.
CHILD = r"""
import asyncio, sys
from pathlib import Path
from opod.ledger import Ledger, journal
from opod.store import Store

if sys.argv[3] == "plain":
    journal.MAPPABLE = frozenset()
ledger = Ledger.open(Store.open(sys.argv[1]), Path(sys.argv[2]), rotate_bytes=4096)
tickets = [ledger.begin(request_id=f"r{i}", api_key_id="k_1", user_id="u", model="m", protocol="openai") for i in range(50)]
ledger.event("node.registered", "n1", {"hostname": "h1"})
for i in range(30):
    ledger.end(tickets[i], outcome="ok", prompt_tokens=i, completion_tokens=2 * i, latency_ms=5, node_id="n1", route={"worker": "n1"})
ledger.event("node.drained", "n1")
print("mapped" if ledger.journal.mapped else "plain", flush=True)
sys.stdin.read()
"""


def _segments(home: Path) -> list[Path]:
    return sorted((home / "ledger").glob("journal-*.jsonl"))


def _mappable(path: Path) -> bool:
    return journal.filesystem(path) in journal.MAPPABLE


@pytest.fixture
def mappable_dir(tmp_path: Path):
    """A directory on a filesystem the journal maps: the test's own, else a tmpfs one (/dev/shm)."""
    if _mappable(tmp_path):
        yield tmp_path
        return
    shm = Path("/dev/shm")
    if not (shm.is_dir() and _mappable(shm)):
        pytest.skip(f"neither {tmp_path} ({journal.filesystem(tmp_path)!r}) nor /dev/shm is a filesystem the journal maps")
    directory = Path(tempfile.mkdtemp(dir=shm, prefix="opod-journal-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_killed_mapped_writer_leaves_every_end_and_start_readable(db_url: str, store: Store, mappable_dir: Path) -> None:
    _killed_writer_recovers(db_url, store, mappable_dir / "home", "mapped")


def test_a_killed_writing_writer_leaves_every_end_and_start_readable(db_url: str, store: Store, tmp_path: Path) -> None:
    _killed_writer_recovers(db_url, store, tmp_path / "home", "plain")


def _killed_writer_recovers(db_url: str, store: Store, home: Path, mode: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, db_url, str(home), mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == f"{mode}\n", child.stderr.read() if child.stderr else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    segments = _segments(home)
    assert len(segments) >= 3 if mode == "mapped" else len(segments) == 1  # full mapped segments started new ones
    # A mapped writer that died leaves its reserved room as NUL padding; os.write leaves none.
    assert segments[-1].read_bytes().endswith(b"\0") == (mode == "mapped")
    assert store.usage_after(0, 100) == []

    ledger = Ledger.open(store, home, keep=timedelta(days=30))
    try:
        assert ledger.journal.bad_lines == 0
        rows = {row.request_id: row for row in store.usage_after(0, 100)}
        assert len(rows) == 50
        for i in range(30):
            row = rows[f"r{i}"]
            assert (row.outcome, row.prompt_tokens, row.completion_tokens, row.node_id) == ("ok", i, 2 * i, "n1")
            assert json.loads(row.route_json or "") == {"worker": "n1"}
        assert all(rows[f"r{i}"].outcome == "interrupted" for i in range(30, 50))
        assert [event.type for event in store.events_after(0, 10)] == ["node.registered", "node.drained"]
    finally:
        ledger.close()
    # The replay deleted what it stored; a second open stores nothing twice.
    Ledger.open(store, home, keep=timedelta(days=30)).close()
    assert len(store.usage_after(0, 100)) == 50


def _write_segment(path: Path, lines: list[bytes], padding: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"journal": "opod-ledger", "version": 1, "boot": 1, "ts_us": 1}).encode() + b"\n"
    path.write_bytes(header + b"".join(lines) + b"\0" * padding)


def _end(entry: str) -> bytes:
    record = {"rec": "end", "entry": entry, "ts_us": 1_700_000_000_000_000, "request_id": entry, "api_key_id": "", "user_id": "",
              "model": "m", "protocol": "openai", "outcome": "ok", "prompt_tokens": 1, "completion_tokens": 1, "latency_ms": 1,
              "ttft_ms": 0, "node_id": "", "route_json": None}
    return json.dumps(record).encode() + b"\n"


def test_padding_is_skipped_and_a_line_torn_by_a_kill_mid_copy_is_counted(tmp_path: Path) -> None:
    directory = tmp_path / "ledger"
    _write_segment(directory / "journal-000001.jsonl", [_end("a"), _end("b")], padding=5000)
    # Killed mid-copy: a copy may store a line's tail before its head, so NULs can sit inside it.
    torn = _end("c")
    _write_segment(directory / "journal-000002.jsonl", [_end("d"), b"\0" * 20 + torn[20:-1]], padding=3000)
    opened = Journal.open(directory)
    try:
        assert [line.record["entry"] for line in opened.read()] == ["a", "b", "d"]
        assert opened.bad_lines == 1
    finally:
        opened.close()


def test_a_segment_filled_while_the_next_one_is_prepared_keeps_every_line(mappable_dir: Path) -> None:
    # The writer's thread prepares the next segment while requests fill the active one and start
    # another on the loop: both must get a segment of their own, and every line stay on disk.
    opened = Journal.open(mappable_dir, reserve=4096)
    header = {"journal": journal.FORMAT, "version": journal.VERSION, "boot": 1, "ts_us": 1}
    try:
        opened.rotate(header, [])
        spare = opened.prepare()
        assert spare is not None
        entries = [f"e{i:03d}" for i in range(60)]  # about four pages of ends: the active segment fills
        assert all(opened.append(_end(entry)) for entry in entries[:30])
        opened.rotate(header, [], spare)  # the spare's number is behind the spilled segment now: not used
        assert all(opened.append(_end(entry)) for entry in entries[30:])
        assert opened.mapped and not opened.broken
        opened.release()
        assert [line.record["entry"] for line in opened.read()] == entries
        assert len(opened.segments()) == len({path.name for path in opened.segments()}) >= 3
    finally:
        opened.close()


def test_a_journal_in_the_previous_format_still_reads(store: Store, tmp_path: Path) -> None:
    # Plain appended files, no padding, the last one torn by a power loss.
    directory = tmp_path / "ledger"
    start = {"rec": "start", "entry": "s", "ts_us": 1_700_000_000_000_000, "request_id": "open", "api_key_id": "k", "user_id": "",
             "model": "m", "protocol": "openai"}
    _write_segment(directory / "journal-000003.jsonl", [_end("x"), json.dumps(start).encode() + b"\n"])
    _write_segment(directory / "journal-000004.jsonl", [_end("y"), b'{"rec":"end","entry":"torn"'])
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    try:
        assert ledger.journal.bad_lines == 1
        assert sorted((row.request_id, row.outcome) for row in store.usage_after(0, 10)) == [("open", "interrupted"), ("x", "ok"), ("y", "ok")]
        assert [path.name for path in _segments(tmp_path)] == ["journal-000005.jsonl"]
    finally:
        ledger.close()


async def test_full_segments_start_new_ones_and_all_go_once_committed(store: Store, tmp_path: Path) -> None:
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1), rotate_bytes=4096)
    try:
        request(ledger, 60)
        ticket = ledger.begin(request_id="long", api_key_id="", user_id="", model="m", protocol="openai")
        ledger.event("big", "", {"blob": "x" * 50_000})  # longer than a segment's room: a segment of its own
        request(ledger, 5, latency_ms=3)
        assert len(_segments(tmp_path)) >= 4 or not ledger.journal.mapped
        await ledger.flush()
        await ledger._rotate_aside()  # what the running writer does once the segment has grown
        assert len(_segments(tmp_path)) == 1
        assert len(store.usage_after(0, 100)) == 65 and store.events_after(0, 10)[0].type == "big"
    finally:
        ledger.close()
    # Closed: the active segment is cut to its length, and holds the start still in flight.
    [last] = _segments(tmp_path)
    data = last.read_bytes()
    assert data.endswith(b"\n") and b"\0" not in data
    assert [json.loads(line).get("request_id") for line in data.splitlines()] == [None, "long"]
    assert ticket.ended is False
    again = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    again.close()
    assert len(store.usage_after(0, 100)) == 66  # the one in flight became interrupted, nothing twice


async def test_a_running_writer_reserves_unmaps_and_deletes_segments_off_the_event_loop(
        store: Store, mappable_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each takes a millisecond or more; on the loop it would hold up every request in flight.
    work: list[tuple[str, int]] = []

    def traced(name: str, function):
        def call(*args, **options):
            work.append((name, threading.get_ident()))
            return function(*args, **options)
        return call

    monkeypatch.setattr(journal, "_mapped", traced("reserve", journal._mapped))
    monkeypatch.setattr(Journal, "release", traced("unmap", Journal.release))
    monkeypatch.setattr(ledger_module, "_delete", traced("delete", ledger_module._delete))
    ledger = Ledger.open(store, mappable_dir, keep=timedelta(days=1), rotate_bytes=4096)
    try:
        assert ledger.journal.mapped
        request(ledger, 11)  # past rotate_bytes, within the segment's reserved room
        assert ledger.journal.size >= 4096 and len(_segments(mappable_dir)) == 1
        await ledger.flush()
        work.clear()
        await ledger._rotate_aside()
        assert {name for name, _ in work} == {"reserve", "unmap", "delete"}
        assert all(thread != threading.get_ident() for _, thread in work), work
        # The new segment holds what comes next; the old one, committed, is gone.
        assert len(_segments(mappable_dir)) == 1 and ledger.journal.mapped
        request(ledger, 2)
        await ledger.flush()
        assert len(store.usage_after(0, 100)) == 13
    finally:
        ledger.close()


def test_only_filesystems_that_reserve_blocks_are_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "filesystem", lambda directory: "btrfs")
    opened = Journal.open(tmp_path / "ledger", reserve=1 << 20)
    try:
        assert opened.reserve == 0
        opened.rotate({"journal": "opod-ledger", "version": 1}, [])
        assert not opened.mapped and opened.append(_end("p"))
    finally:
        opened.close()
    assert [line.record["entry"] for line in Journal.open(tmp_path / "ledger").read()] == ["p"]
