"""The journal's segments: every line in the page cache once its write returns, read back whole
after a kill, in whatever state a writer left them (NUL padding, a torn last line)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from opod.ledger import Ledger
from opod.ledger import ledger as ledger_module
from opod.ledger.journal import Journal
from opod.store import Store
from tests.ledger.conftest import request

# A leader that journals 30 ends, 20 starts still in flight and two events, commits nothing, and
# waits to be killed.
CHILD = r"""
import asyncio, sys
from pathlib import Path
from opod.ledger import Ledger
from opod.store import Store

ledger = Ledger.open(Store.open(sys.argv[1]), Path(sys.argv[2]))
tickets = [ledger.begin(request_id=f"r{i}", api_key_id="k_1", user_id="u", model="m", protocol="openai") for i in range(50)]
ledger.event("node.registered", "n1", {"hostname": "h1"})
for i in range(30):
    ledger.end(tickets[i], outcome="ok", prompt_tokens=i, completion_tokens=2 * i, latency_ms=5, node_id="n1", route={"worker": "n1"})
ledger.event("node.drained", "n1")
print("ready", flush=True)
sys.stdin.read()
"""


def _segments(home: Path) -> list[Path]:
    return sorted((home / "ledger").glob("journal-*.jsonl"))


def test_a_killed_writer_leaves_every_end_and_start_readable(db_url: str, store: Store, tmp_path: Path) -> None:
    home = tmp_path / "home"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, db_url, str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n", (
            child.stderr.read() if child.stderr else ""
        )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert len(_segments(home)) == 1
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
    record = {
        "rec": "end",
        "entry": entry,
        "ts_us": 1_700_000_000_000_000,
        "request_id": entry,
        "api_key_id": "",
        "user_id": "",
        "model": "m",
        "protocol": "openai",
        "outcome": "ok",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "latency_ms": 1,
        "ttft_ms": 0,
        "node_id": "",
        "route_json": None,
    }
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


def test_a_journal_whose_last_line_was_torn_by_a_power_loss_still_reads(store: Store, tmp_path: Path) -> None:
    # Two segments, no padding, the last line torn.
    directory = tmp_path / "ledger"
    start = {
        "rec": "start",
        "entry": "s",
        "ts_us": 1_700_000_000_000_000,
        "request_id": "open",
        "api_key_id": "k",
        "user_id": "",
        "model": "m",
        "protocol": "openai",
    }
    _write_segment(directory / "journal-000003.jsonl", [_end("x"), json.dumps(start).encode() + b"\n"])
    _write_segment(directory / "journal-000004.jsonl", [_end("y"), b'{"rec":"end","entry":"torn"'])
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    try:
        assert ledger.journal.bad_lines == 1
        assert sorted((row.request_id, row.outcome) for row in store.usage_after(0, 10)) == [
            ("open", "interrupted"),
            ("x", "ok"),
            ("y", "ok"),
        ]
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
        await ledger.flush()
        ledger._rotate()  # what the running writer does once the segment has grown
        await ledger._trim_aside()
        assert len(_segments(tmp_path)) == 1
        assert len(store.usage_after(0, 100)) == 65 and store.events_after(0, 10)[0].type == "big"
    finally:
        ledger.close()
    # Closed: the active segment holds the start still in flight.
    [last] = _segments(tmp_path)
    data = last.read_bytes()
    assert data.endswith(b"\n") and b"\0" not in data
    assert [json.loads(line).get("request_id") for line in data.splitlines()] == [None, "long"]
    assert ticket.ended is False
    again = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    again.close()
    assert len(store.usage_after(0, 100)) == 66  # the one in flight became interrupted, nothing twice


async def test_a_running_writer_deletes_committed_segments_off_the_event_loop(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unlinking a grown segment can take a millisecond or more; on the loop every request in flight would wait.
    deleted_in: list[int] = []
    delete = ledger_module._delete

    def traced(segments: list[Path]) -> None:
        delete(segments)
        deleted_in.append(threading.get_ident())  # after: the test reads the directory once this is seen

    monkeypatch.setattr(ledger_module, "_delete", traced)
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1), rotate_bytes=4096)
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    try:
        request(ledger, 11)  # past rotate_bytes
        for _ in range(500):
            if deleted_in:
                break
            await asyncio.sleep(0.01)
        assert deleted_in and all(thread != threading.get_ident() for thread in deleted_in)
        assert len(_segments(tmp_path)) == 1  # the new segment; the old one, committed, is gone
        request(ledger, 2)
        await ledger.flush()
        assert len(store.usage_after(0, 100)) == 13
    finally:
        stop.set()
        await writer
        ledger.close()


async def test_a_stream_the_leader_never_saw_end_is_recorded_as_far_as_it_got(store: Store, tmp_path: Path) -> None:
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1), rotate_bytes=4096)
    try:
        ticket = ledger.begin(request_id="streaming", api_key_id="k_1", user_id="", model="m", protocol="openai")
        ledger.progress(ticket, prompt_tokens=40, completion_tokens=12, node_id="n1")
        request(ledger, 60)
        await ledger.flush()
        ledger._rotate()  # the stream's start and its progress go on in the new segment
        await ledger._trim_aside()
        ledger.progress(ticket, prompt_tokens=40, completion_tokens=31, node_id="n1")
        done = ledger.begin(request_id="finished", api_key_id="", user_id="", model="m", protocol="openai")
        ledger.progress(done, prompt_tokens=5, completion_tokens=3)
        ledger.end(done, outcome="ok", prompt_tokens=6, completion_tokens=9, latency_ms=1)
        await ledger.flush()
    finally:
        ledger.close()
    # As after a kill: the journal is read back on the next start.
    again = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    again.close()
    rows = {row.request_id: row for row in store.usage_after(0, 100)}
    streaming = rows["streaming"]
    assert (streaming.outcome, streaming.prompt_tokens, streaming.completion_tokens, streaming.node_id) == (
        "interrupted",
        40,
        31,
        "n1",
    )
    assert json.loads(streaming.route_json or "{}") == {"prompt_tokens": "estimated"}
    assert (rows["finished"].prompt_tokens, rows["finished"].completion_tokens) == (6, 9), (
        "an end wins over its progress"
    )
