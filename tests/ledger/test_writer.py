"""The writer and the request path under faults: a store that fails, a journal that cannot be
written, values the store would refuse, ends from other threads, a clean stop."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import pytest

from opod.ledger import Ledger, journal
from opod.ledger.ledger import COMMIT_EVERY_S, COMMIT_UNDER_LOAD_S
from opod.ledger.records import UsageTicket, finished_record
from opod.ledger.writer import WRITER_NICE
from opod.store import Store
from opod.store.events import INT64_MAX
from tests.ledger.conftest import request


async def _until(condition, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_the_running_writer_commits_soon_after_end(ledger: Ledger) -> None:
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    request(ledger, 5)
    await _until(lambda: len(ledger.store.usage_after(0, 10)) == 5, 5)
    stop.set()
    await writer


async def test_under_a_steady_load_rows_gather_into_one_commit_per_interval(ledger: Ledger) -> None:
    # One end every 2 ms for about half a second: a commit per row would be ~250 transactions.
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    await asyncio.sleep(0.05)
    began = asyncio.get_running_loop().time()
    for i in range(250):
        request(ledger, 1, latency_ms=i)
        await asyncio.sleep(0.002)
    spent = asyncio.get_running_loop().time() - began
    await _until(lambda: len(ledger.store.usage_after(0, 1000)) == 250, 5)
    stop.set()
    await writer
    intervals = spent / COMMIT_EVERY_S
    assert ledger.writer.commits <= intervals + 3, f"{ledger.writer.commits} commits for {spent:.2f}s of load"
    assert ledger.writer.commits < 100


async def _commits_while(ledger: Ledger, rows_per_s: float, seconds: float) -> tuple[int, float]:
    """Rows ended steadily at ``rows_per_s`` for ``seconds`` with the writer running: its commits meanwhile, and the
    longest a row waited for its commit (seen every 10 ms)."""
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    began, commits, first, sent, longest = loop.time(), ledger.writer.commits, ledger.writer.recorded, 0, 0.0
    ended_at: list[float] = []
    while (now := loop.time()) - began < seconds:
        while sent < (now - began) * rows_per_s:
            request(ledger, 1, latency_ms=sent)
            ended_at.append(loop.time())
            sent += 1
        committed = ledger.writer.committed - first
        if committed < len(ended_at):
            longest = max(longest, now - ended_at[committed])
        await asyncio.sleep(0.01)
    commits = ledger.writer.commits - commits
    stop.set()
    await writer
    return commits, longest


async def test_a_steady_load_commits_about_once_a_second_and_a_light_one_every_fifth(ledger: Ledger) -> None:
    # 300 rows a second: batches of a second's rows (fewer, larger commits cost less per row).
    commits, longest = await _commits_while(ledger, 300, 2.5)
    assert 2 <= commits <= 5, f"{commits} commits in 2.5 s of a steady load"
    assert longest <= COMMIT_UNDER_LOAD_S + 0.5
    # 20 rows a second: below the steady load, a commit every COMMIT_EVERY_S and no row waits longer.
    commits, longest = await _commits_while(ledger, 20, 1.5)
    assert commits >= 1.5 / COMMIT_EVERY_S - 3, f"{commits} commits in 1.5 s of a light load"
    assert longest <= COMMIT_EVERY_S + 0.3


async def test_rows_wait_out_a_failing_store_and_are_committed_when_it_is_back(
    db_url: str, store: Store, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger.open(store, home, keep=timedelta(days=1))
    ledger.writer.store = broken = Store.open(db_url)
    broken.close()  # every commit now fails with "the store is closed"
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    request(ledger, 10)
    await _until(lambda: "cannot commit 10 records" in caplog.text)
    assert store.usage_after(0, 100) == [] and ledger.writer.backlog == 10
    ledger.writer.store = store  # the database is back
    await _until(lambda: len(store.usage_after(0, 100)) == 10, 15)
    stop.set()
    await writer
    ledger.close()


async def test_a_stop_commits_what_is_left_and_trims_the_journal(ledger: Ledger, home: Path) -> None:
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    in_flight = ledger.begin(request_id="long", api_key_id="", user_id="", model="m", protocol="openai")
    request(ledger, 50)
    stop.set()
    await writer
    assert len(ledger.store.usage_after(0, 100)) == 50
    [segment] = sorted((home / "ledger").glob("journal-*.jsonl"))
    lines = [json.loads(line) for line in segment.read_bytes().splitlines()]
    # The committed ends are gone from the journal; the start still in flight was carried over.
    assert [line.get("rec") for line in lines] == [None, "start"] and lines[1]["request_id"] == "long"
    ledger.close()
    assert in_flight.ended is False


async def test_a_journal_that_cannot_be_written_keeps_the_row_in_memory(
    open_ledger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = open_ledger()
    # Swap the journal's descriptor for a read-only one: every write now fails with EBADF.
    read_only = os.open(os.devnull, os.O_RDONLY)
    os.dup2(read_only, ledger.journal._fd)  # type: ignore[arg-type]
    os.close(read_only)
    with caplog.at_level(logging.ERROR, logger="opod.ledger"):
        request(ledger, 3)
    assert caplog.text.count("LEDGER JOURNAL WRITE FAILED") == 1  # loud once, not once per request
    await ledger.flush()
    assert [row.request_id for row in ledger.store.usage_after(0, 10)] == ["r0", "r1", "r2"]
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    await _until(lambda: not ledger.journal.broken)  # the writer started a fresh segment
    stop.set()
    await writer


async def test_a_segment_that_cannot_be_started_on_a_full_disk_leaves_the_old_one_in_use(
    open_ledger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = open_ledger(rotate_bytes=4096)
    [segment] = sorted(ledger.journal.directory.glob("journal-*.jsonl"))

    def disk_full(*args: object, **options: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal, "_written", disk_full)
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    request(ledger, 40)  # past rotate_bytes: the writer tries to start a new segment, and cannot
    await _until(lambda: "cannot start a new journal segment" in caplog.text)
    request(ledger, 5, latency_ms=3)
    stop.set()
    await writer
    assert len(ledger.store.usage_after(0, 100)) == 45 and not ledger.journal.broken
    # Every end is still journaled, in the segment that stayed in use.
    ends = [json.loads(line) for line in segment.read_bytes().splitlines() if b'"end"' in line]
    assert len(ends) == 45


async def test_bad_values_never_raise_into_the_request_and_are_stored_cleaned(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ticket = ledger.begin(request_id=None, api_key_id="k\x00", user_id=7, model="m" * 5000, protocol="openai")  # type: ignore[arg-type]
    loop = {"self": None}
    loop["self"] = loop  # a cycle: not JSON
    ledger.end(
        ticket,
        outcome="exploded",
        prompt_tokens=-4,
        completion_tokens="12",
        latency_ms=2.7,
        ttft_ms=None,
        node_id=None,
        route=loop,
    )  # type: ignore[arg-type]
    ledger.end("not a ticket", outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)  # type: ignore[arg-type]
    ledger.end(ticket, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)  # a second end
    ledger.event(None, "n", ["not", "a", "dict"])  # type: ignore[arg-type]
    await ledger.flush()
    [row] = ledger.store.usage_after(0, 10)
    assert (row.request_id, row.api_key_id, row.user_id, len(row.model)) == ("", "k", "7", 1024)
    assert (row.outcome, row.prompt_tokens, row.completion_tokens, row.latency_ms, row.ttft_ms) == (
        "exploded",
        0,
        12,
        2,
        0,
    )
    assert json.loads(row.route_json or "")["value"].startswith("{'self'")
    [event] = (await ledger.events_page(0, None)).events
    assert (event.type, event.data) == ("unknown", {"value": ["not", "a", "dict"]})
    for words in (
        "outcome 'exploded' is not one of ok, error, cancelled, interrupted",
        "prompt_tokens -4 was stored as 0",
        "end() needs the ticket begin() returned",
        "ended twice",
    ):
        assert words in caplog.text


@pytest.mark.parametrize(
    ("name", "given", "stored"),
    [
        ("prompt_tokens", -1, 0),
        ("completion_tokens", INT64_MAX + 1, INT64_MAX),
        ("latency_ms", True, 1),
        ("ttft_ms", 2.5, 2),
    ],
)
def test_one_count_out_of_range_is_cleaned_among_counts_at_the_edges(
    name: str, given: object, stored: int, caplog: pytest.LogCaptureFixture
) -> None:
    # The end's counts are checked together: one out of range among others at 0 and INT64_MAX is caught alone.
    edges = {"prompt_tokens": 0, "completion_tokens": INT64_MAX, "latency_ms": INT64_MAX, "ttft_ms": 0}
    ticket = UsageTicket("e", "r", "k", "u", "m", "openai", 1)
    kept = finished_record(ticket, 2, "ok", **edges, node_id="n", route=None)  # type: ignore[arg-type]
    assert {field: kept[field] for field in edges} == edges and not caplog.text
    record = finished_record(ticket, 2, "ok", **{**edges, name: given}, node_id="n", route=None)  # type: ignore[arg-type]
    assert {field: record[field] for field in edges} == {**edges, name: stored}
    assert f"{name} {given!r} was stored as {stored}" in caplog.text


async def test_a_record_the_store_refuses_is_set_aside_not_lost(store: Store, home: Path) -> None:
    (home / "ledger").mkdir(parents=True)
    good = {"rec": "end", "entry": "a-1", "ts_us": 1_700_000_000_000_000, "request_id": "good", "outcome": "ok"}
    bad = {
        "rec": "event",
        "entry": "a-2",
        "ts_us": 1_700_000_000_000_000,
        "type": "x",
        "subject": "",
        "data_json": "[1, 2]",
    }
    (home / "ledger" / "journal-000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (good, bad)))
    ledger = Ledger.open(store, home, keep=timedelta(days=1))
    assert [row.request_id for row in store.usage_after(0, 10)] == ["good"] and store.events_after(0, 10) == []
    [rejected] = [json.loads(line) for line in (home / "ledger" / "rejected.jsonl").read_text().splitlines()]
    assert rejected["record"] == bad and "must be a JSON object" in rejected["why"]
    ledger.close()


async def test_a_replayed_end_is_cleaned_or_set_aside_and_its_batch_stored(store: Store, home: Path) -> None:
    (home / "ledger").mkdir(parents=True)
    end = {"rec": "end", "entry": "a-1", "ts_us": 1_700_000_000_000_000, "request_id": "good", "outcome": "ok"}
    unreadable = {**end, "entry": "a-2", "request_id": "unreadable", "route_json": "{"}
    odd = {**end, "entry": "a-3", "request_id": "odd\x00", "model": "m\ud800", "prompt_tokens": "7", "cache_hit": 1}
    lines = "".join(json.dumps(r) + "\n" for r in ({**end, "route_json": '{"worker": "n1"}'}, unreadable, odd))
    (home / "ledger" / "journal-000001.jsonl").write_text(lines)
    ledger = Ledger.open(store, home, keep=timedelta(days=1))
    rows = store.usage_after(0, 10)
    assert [(r.request_id, r.model, r.prompt_tokens, r.cache_hit, r.route_json) for r in rows] == [
        ("good", "", 0, False, '{"worker": "n1"}'),
        ("odd", "m?", 7, False, None),
    ]
    [rejected] = [json.loads(line) for line in (home / "ledger" / "rejected.jsonl").read_text().splitlines()]
    assert rejected["record"] == unreadable and "route_json of usage entry 'a-2' is not valid JSON" in rejected["why"]
    ledger.close()


async def test_ends_from_other_threads_wake_the_writer(ledger: Ledger) -> None:
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    await asyncio.sleep(0.05)
    threads = [threading.Thread(target=request, args=(ledger, 100)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    await _until(lambda: len(ledger.store.usage_after(0, 1000)) == 400, 5)
    stop.set()
    await writer
    assert len({row.entry for row in ledger.store.usage_after(0, 1000)}) == 400


class _Mapping(Mapping):
    def __init__(self, data: dict) -> None:
        self._data = data

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


async def test_values_the_store_would_refuse_are_stored_cleaned_not_set_aside(ledger: Ledger) -> None:
    # Lone surrogates, NUL, overlong text, counts out of range, blank names, odd JSON: cleaned on the request path.
    ticket = ledger.begin(request_id="r\ud800", api_key_id="k\x00", user_id=7, model="m\udfff" * 600, protocol="openai")  # type: ignore[arg-type]
    ledger.end(
        ticket,
        outcome="  ",
        prompt_tokens=True,
        completion_tokens=2**70,
        latency_ms=1.5,
        node_id="n\udc80",  # type: ignore[arg-type]
        route={"why": "\ud800", "nan": float("nan"), 3: "int key"},
    )
    ledger.event(" ", "n\ud800", _Mapping({"k": "v"}))
    ledger.event("x", "", {("a", "b"): 1})  # a key JSON cannot hold
    await ledger.flush()
    [row] = ledger.store.usage_after(0, 10)
    assert (row.request_id, row.outcome, row.completion_tokens, row.node_id) == ("r?", "error", 2**63 - 1, "n?")
    assert (len(row.model), row.model[:2]) == (1024, "m?")
    events = (await ledger.events_page(0, None)).events
    assert [(e.type, e.subject, e.data) for e in events][0] == ("unknown", "n?", {"k": "v"})
    assert not (ledger.journal.directory / "rejected.jsonl").exists()


@pytest.mark.parametrize("whole", [True, False])  # the database refuses its NULL entry; not of the ledger's shape
async def test_a_live_record_the_store_refuses_is_set_aside_and_its_batch_stored(ledger: Ledger, whole: bool) -> None:
    request(ledger, 2)
    ticket = ledger.begin(request_id="model", api_key_id="", user_id="", model="m", protocol="openai")
    ledger.end(ticket, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)
    odd = {"rec": "end", "entry": None, "ts_us": 1_700_000_000_000_000, "request_id": "odd"}
    ledger.writer.add(record := {**ledger.writer._pending[-1][1], **odd} if whole else odd)
    request(ledger, 1, latency_ms=7)
    await ledger.flush()
    assert sorted((row.request_id, row.latency_ms) for row in ledger.store.usage_after(0, 10)) == [
        ("model", 1),
        ("r0", 7),
        ("r0", 10),
        ("r1", 10),
    ]
    [rejected] = [json.loads(line) for line in (ledger.journal.directory / "rejected.jsonl").read_text().splitlines()]
    assert rejected["record"] == record and "needs an entry" in rejected["why"]
    assert ledger.writer.backlog == 0


async def test_an_idle_writer_stops_as_soon_as_it_is_told(ledger: Ledger) -> None:
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    request(ledger, 1)
    await _until(lambda: len(ledger.store.usage_after(0, 10)) == 1, 5)
    await asyncio.sleep(0.1)  # nothing left to write: the writer waits for the next row
    loop = asyncio.get_running_loop()
    told = loop.time()
    stop.set()
    await writer
    assert loop.time() - told < 0.5, "a leader's stop waited on its idle ledger writer"


class _Odd:
    """A value JSON cannot hold (a caller's bug the type checker missed)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


async def test_a_value_json_cannot_hold_is_stored_as_its_text_not_lost(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ticket = ledger.begin(request_id="odd", api_key_id=_Odd("k-odd"), user_id="u", model="m", protocol="openai")  # type: ignore[arg-type]
    ledger.end(
        ticket,
        outcome="ok",
        prompt_tokens=1,
        completion_tokens=2,
        latency_ms=3,
        details={"status": 200, "served_model": _Odd("m-odd")},
    )
    await ledger.flush()
    row = ledger.store.find_request("odd")
    assert (row.api_key_id, row.served_model, row.prompt_tokens, row.completion_tokens) == ("k-odd", "m-odd", 1, 2)
    assert "api_key_id" in caplog.text and "served_model" in caplog.text


async def test_what_a_client_or_webhook_gave_is_cleaned_before_it_is_journaled(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    guard = {"guard_action": "flag", "guard_policy": "p", "guard_rule": "pre", "guard_category": "why\x00not"}
    ticket = ledger.begin(
        request_id="given",
        api_key_id="k",
        user_id="u",
        model="m",
        protocol="openai",
        end_user="al\x00ice",
        details=guard,
    )
    ledger.end(
        ticket, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1, details={**guard, "status": 200}
    )
    [segment] = ledger.journal.segments()
    lines = [json.loads(line) for line in segment.read_bytes().splitlines()[1:]]
    assert [(r["rec"], r["end_user"], r["guard_category"]) for r in lines] == [
        ("start", "alice", "whynot"),
        ("end", "alice", "whynot"),
    ]
    assert "end_user 'al\\x00ice' was stored as 'alice'" in caplog.text
    assert "guard_category 'why\\x00not' was stored as 'whynot'" in caplog.text
    await ledger.flush()
    row = ledger.store.find_request("given")
    assert (row.end_user, row.guard_category, row.status) == ("alice", "whynot", 200)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="one thread's own priority is Linux's (nice per thread)"
)
async def test_commits_run_in_one_thread_of_their_own_below_the_event_loops_priority(ledger: Ledger) -> None:
    """What `top -H` shows an operator: the rows are committed by the ledger's writer thread, niced below the
    thread that serves requests, so a commit's burst of CPU waits for the event loop instead of holding it up."""
    before = set(threading.enumerate())
    for _ in range(3):
        request(ledger, 2)
        await ledger.flush()
    assert len(ledger.store.usage_after(0, 10)) == 6
    writers = [t for t in set(threading.enumerate()) - before if t.name.startswith("opod ledger writer")]
    assert [t.name for t in writers] == ["opod ledger writer_0"]  # made for the first commit, one for all
    assert writers[0].native_id is not None
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert os.getpriority(os.PRIO_PROCESS, writers[0].native_id) == min(loop_nice + WRITER_NICE, 19)


async def test_a_closed_ledger_lets_its_writer_thread_go(ledger: Ledger) -> None:
    before = set(threading.enumerate())
    request(ledger, 1)
    await ledger.flush()
    (writer,) = [t for t in set(threading.enumerate()) - before if t.name.startswith("opod ledger writer")]
    ledger.close()
    ledger.close()  # idempotent
    await _until(lambda: not writer.is_alive(), 5)
