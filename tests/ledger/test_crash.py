"""A leader SIGKILLed mid-flight: every ended request is a row, every unended one is interrupted,
and replaying the journal again adds nothing."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from opod.ledger import JournalError, Ledger
from opod.store import Store

# The scripted child: 20 requests ended and committed, 20 ended but not committed (cancelled with
# the tokens sent, or errors), 20 in flight; then it waits to be killed.
SCRIPTED = r"""
import asyncio, sys
from pathlib import Path
from opod.store import Store
from opod.ledger import Ledger

async def main():
    ledger = Ledger.open(Store.open(sys.argv[1]), Path(sys.argv[2]))
    tickets = [ledger.begin(request_id=f"r{i}", api_key_id="k_1", user_id="u", model="m", protocol="openai") for i in range(60)]
    for i in range(20):
        ledger.end(tickets[i], outcome="ok", prompt_tokens=i, completion_tokens=i, latency_ms=5, node_id="n1")
    ledger.event("node.registered", "n1", {"hostname": "h1"})
    await ledger.flush()
    for i in range(20, 40):
        ledger.end(tickets[i], outcome="cancelled" if i % 2 else "error", prompt_tokens=i, completion_tokens=i // 2, latency_ms=5)
    ledger.event("node.drained", "n1")
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""

# The streaming child: the writer runs and the journal rotates often; after each end() returns it
# says so, and every tenth request stays in flight. It is killed at an arbitrary moment.
STREAMING = r"""
import asyncio, sys
from pathlib import Path
from opod.store import Store
from opod.ledger import Ledger

async def main():
    ledger = Ledger.open(Store.open(sys.argv[1]), Path(sys.argv[2]), rotate_bytes=16 * 1024)
    writer = asyncio.create_task(ledger.run(asyncio.Event()))
    keep = []
    for i in range(1_000_000):
        ticket = ledger.begin(request_id=f"s{i}", api_key_id="k_1", user_id="u", model="m", protocol="openai")
        if i % 10 == 9:
            keep.append(ticket)
            print(f"began s{i}", flush=True)
            continue
        ledger.end(ticket, outcome="ok", prompt_tokens=1, completion_tokens=i, latency_ms=1)
        print(f"ended s{i}", flush=True)
        if i % 20 == 0:
            await asyncio.sleep(0)  # let the writer commit a batch

asyncio.run(main())
"""


def _child(script: str, db_url: str, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, db_url, str(home)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def _rows(store: Store) -> list:
    rows, after = [], 0
    while page := store.usage_after(after, 1000):
        rows += page
        after = page[-1].id
    return rows


def _segments(home: Path) -> list[Path]:
    return sorted((home / "ledger").glob("journal-*.jsonl"))


def test_a_killed_leader_loses_no_ended_request_and_marks_the_rest_interrupted(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    child = _child(SCRIPTED, db_url, home)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n", (
            child.stderr.read() if child.stderr else ""
        )
    finally:
        _kill(child)
    committed_before = len(_rows(store))
    assert committed_before == 20  # the flushed ones; the rest exist only in the journal
    saved = tmp_path / "saved"
    saved.mkdir()
    for path in _segments(home):
        shutil.copy2(path, saved / path.name)

    ledger = Ledger.open(store, home, keep=timedelta(days=30))
    rows = {row.request_id: row for row in _rows(store)}
    assert len(rows) == 60
    for i in range(20):
        assert (rows[f"r{i}"].outcome, rows[f"r{i}"].completion_tokens, rows[f"r{i}"].node_id) == ("ok", i, "n1")
    for i in range(20, 40):
        assert (rows[f"r{i}"].outcome, rows[f"r{i}"].prompt_tokens, rows[f"r{i}"].completion_tokens) == (
            "cancelled" if i % 2 else "error",
            i,
            i // 2,
        )
    for i in range(40, 60):
        row = rows[f"r{i}"]
        assert (row.outcome, row.prompt_tokens, row.completion_tokens, row.api_key_id, row.model) == (
            "interrupted",
            0,
            0,
            "k_1",
            "m",
        )
    assert [e.type for e in store.events_after(0, 10)] == ["node.registered", "node.drained"]
    ledger.close()

    # Replay the very same journal a second time (as if the first replay had been killed before
    # it could delete it): nothing is stored twice.
    for path in saved.iterdir():
        shutil.copy2(path, home / "ledger" / path.name)
    Ledger.open(store, home, keep=timedelta(days=30)).close()
    again = _rows(store)
    assert len(again) == 60 and Counter(row.entry for row in again).most_common(1)[0][1] == 1
    assert len(store.events_after(0, 10)) == 2


def test_every_end_that_returned_before_a_kill_is_a_row(db_url: str, store: Store, tmp_path: Path) -> None:
    home = tmp_path / "home"
    child = _child(STREAMING, db_url, home)
    ended: set[str] = set()
    began: set[str] = set()
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60
        while len(ended) < 3000 and time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line, child.stderr.read() if child.stderr else "the child died"
            word, request_id = line.split()
            (ended if word == "ended" else began).add(request_id)
    finally:
        _kill(child)
    assert len(ended) >= 3000
    Ledger.open(store, home, keep=timedelta(days=30)).close()
    rows = _rows(store)
    by_id = {row.request_id: row for row in rows}
    assert len(by_id) == len(rows)  # no duplicates
    assert ended <= by_id.keys() and all(by_id[r].outcome == "ok" for r in ended)
    assert began <= by_id.keys() and all(by_id[r].outcome == "interrupted" for r in began)
    # The journal was rotated and trimmed while the child ran (16 KiB segments), and the starts in
    # flight were carried across; after the replay only a fresh segment is left.
    [last] = _segments(home)
    assert int(last.stem.split("-")[1]) >= 3, last.name


def test_a_second_leader_on_the_same_home_is_refused(store: Store, tmp_path: Path) -> None:
    first = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    ticket = first.begin(request_id="live", api_key_id="", user_id="", model="m", protocol="openai")
    with pytest.raises(
        JournalError,
        match="another running opod leader uses the ledger in .*; stop it, or give this one its own OPOD_HOME",
    ):
        Ledger.open(store, tmp_path, keep=timedelta(days=1))
    # The refused open did not turn the live request into an interrupted row.
    assert store.usage_after(0, 10) == []
    first.end(ticket, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)
    first.close()


def test_a_torn_last_line_is_skipped_and_the_rest_replayed(store: Store, tmp_path: Path) -> None:
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    for i in range(3):
        ticket = ledger.begin(request_id=f"t{i}", api_key_id="", user_id="", model="m", protocol="openai")
        ledger.end(ticket, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)
    ledger.journal.close()  # as a crash would: nothing committed, nothing trimmed
    [segment] = _segments(tmp_path)
    with segment.open("ab") as handle:
        handle.write(b'{"rec":"end","entry":"torn-1","ts_us":17')  # a power loss cut this line short
    again = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    assert again.journal.bad_lines == 1
    assert sorted(row.request_id for row in _rows(store)) == ["t0", "t1", "t2"]
    again.close()


def test_a_journal_from_a_newer_opod_is_not_guessed_at(store: Store, tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "journal-000009.jsonl").write_text('{"journal":"opod-ledger","version":2}\n{"rec":"end"}\n')
    with pytest.raises(
        JournalError, match="written by journal version 2, this opod reads version 1; run the opod that wrote it"
    ):
        Ledger.open(store, tmp_path, keep=timedelta(days=1))
    assert (tmp_path / "ledger" / "journal-000009.jsonl").exists()


def test_text_beyond_ascii_survives_the_journal(store: Store, tmp_path: Path) -> None:
    ledger = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    ticket = ledger.begin(
        request_id="r-ü", api_key_id="", user_id="ユーザー", model="modèle:adaptér", protocol="openai"
    )
    ledger.end(
        ticket, outcome="ok", prompt_tokens=3, completion_tokens=2, latency_ms=5, route={"why": "préfixe", "blocks": 2}
    )
    ledger.journal.close()  # as a crash would: only the journal holds the row
    again = Ledger.open(store, tmp_path, keep=timedelta(days=1))
    [row] = _rows(store)
    assert (row.request_id, row.user_id, row.model, row.completion_tokens) == ("r-ü", "ユーザー", "modèle:adaptér", 2)
    assert row.route_json is not None and '"why":"préfixe"' in row.route_json
    again.close()
