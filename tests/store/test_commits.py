"""The store's commit mark, on SQLite and PostgreSQL: it moves when another connection or process commits a change,
and stays put for reads and for writes that change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta

import pytest

from opod.store import Store, StoreError
from opod.store.offloop import run_sync
from tests.store.conftest import quietly

OWNER = "host:/home"


async def test_reads_and_writes_that_change_no_row_leave_the_mark_as_it_was(store: Store) -> None:
    async def idle_rounds() -> None:
        # What an idle leader still does: reads, and a claim of batches that finds none.
        await run_sync(store.settings_newest)
        await run_sync(store.list_quotas)
        await run_sync(store.client_jobs_left)
        await run_sync(store.claim_client_jobs, OWNER, lease=timedelta(seconds=30))

    await quietly(store, idle_rounds)


async def test_a_commit_on_another_handle_moves_the_mark(open_store: Callable[[], Store]) -> None:
    ours, theirs = open_store(), open_store()
    before = ours.commit_mark()
    await run_sync(theirs.put_settings, 0, "retention: {bodies_days: 2}\n", by="another leader")
    after = ours.commit_mark()
    assert after != before
    await run_sync(ours.set_meta, "note", "written here")  # this process's other connections count as well
    assert ours.commit_mark() != after


def test_a_commit_by_another_process_moves_the_mark(store: Store, db_url: str) -> None:
    before = store.commit_mark()
    writes = "import sys; from opod.store import Store; Store.open(sys.argv[1]).set_meta('note', 'from elsewhere')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    done = subprocess.run([sys.executable, "-c", writes, db_url], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert store.commit_mark() != before
    assert store.get_meta("note") == "from elsewhere"


def test_a_closed_store_gives_no_mark(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.commit_mark()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.commit_mark()
