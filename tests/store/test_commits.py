"""The store's commit mark, on SQLite and PostgreSQL: it moves when another connection or process commits a change,
and stays put for reads, for writes that change nothing, and on SQLite for the ledger's own writes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from sqlalchemy import text

from opod.store import InvalidInput, NotFound, Store, StoreError
from opod.store.offloop import run_sync
from opod.store.requests import RequestBody
from tests.store.conftest import NOTICED_S, at, moved, quietly
from tests.store.test_keys import make_key
from tests.store.test_nodes import register
from tests.store.test_usage_events import event
from tests.store.test_usage_events import usage as usage_row

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
    after = await moved(ours, before)
    await run_sync(ours.create_org, "acme")  # this process's other connections count as well
    await moved(ours, after)


async def test_a_commit_by_another_process_moves_the_mark(store: Store, db_url: str) -> None:
    before = store.commit_mark()
    writes = "import sys; from opod.store import Store; Store.open(sys.argv[1]).create_org('elsewhere')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    argv = [sys.executable, "-c", writes, db_url]
    done = await run_sync(partial(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60))
    assert done.returncode == 0, done.stderr[-2000:]
    await moved(store, before)
    assert [org.name for org in store.tenancy_tree().orgs] == ["elsewhere"]


def test_a_closed_store_gives_no_mark(open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.commit_mark()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.commit_mark()


def kept_body(request_id: str, answer: str) -> RequestBody:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    return RequestBody(
        request_id=request_id,
        project_id="prj_1",
        at=at,
        expires_at=at + timedelta(days=7),
        path="/v1/chat/completions",
        model="m",
        served_model="m",
        status=200,
        request='{"model": "m"}',
        response=answer,
        truncated=False,
    )


async def test_the_ledgers_writes_leave_the_mark_and_an_operators_change_moves_it(
    open_store: Callable[[], Store],
) -> None:
    """A leader busy serving writes only its ledger: no change for its followers to read."""
    store, elsewhere = open_store(), open_store()

    async def serve(n: int) -> None:
        assert store.append_ledger([usage_row(f"u{n}")], [event(f"e{n}")], check_known=n == 0) == (1, 1)
        assert store.keep_request_bodies([kept_body(f"req-u{n}", f'{{"n": {n}}}')]) == 1

    for n in range(3):
        await quietly(store, partial(serve, n))
    assert [r.entry for r in store.usage_after(0, 10)] == ["u0", "u1", "u2"]
    assert store.get_request_body("req-u2").response == '{"n": 2}'
    before = store.commit_mark()
    store.create_org("acme")
    after = await moved(store, before)
    elsewhere.append_ledger([usage_row("from-another-leader")])
    if store.engine.dialect.name == "sqlite":
        await moved(store, after)  # SQLite cannot tell another connection's ledger from any other change
    else:
        await asyncio.sleep(NOTICED_S)
        assert store.commit_mark() == after  # another leader busy serving is no change either


async def test_a_keys_last_use_and_a_nodes_last_heartbeat_leave_the_mark(store: Store) -> None:
    """A busy leader writes when its keys were last used and when its nodes were last heard from, every few seconds:
    no follower reads either, so neither may send every leader to read the keys, people and tenancy again."""
    key = make_key(store, "sk-busy")
    register(store, "node-a")
    later = iter(range(10, 10_000))

    async def serve() -> tuple[int, None]:
        tick = at(next(later))
        return await run_sync(store.mark_keys_used, [key.id], tick), await run_sync(store.touch_nodes, ["node-a"], tick)

    moved_keys, _ = await quietly(store, serve)
    assert moved_keys == 1  # the write happened: the key's time moved, and the followers were not told
    assert store.get_key(key.id).last_used_at == store.get_node("node-a").last_seen_at
    before = store.commit_mark()
    await run_sync(store.revoke_key, key.id)  # a change the key table must follow still moves the mark
    await moved(store, before)


def test_bodies_kept_again_replace_the_earlier_ones_in_one_batch(store: Store) -> None:
    assert store.keep_request_bodies([kept_body("r1", '{"a": 1}'), kept_body("r2", '{"b": 1}')]) == 2
    assert store.keep_request_bodies([kept_body("r1", '{"a": 2}'), kept_body("r1", '{"a": 3}')]) == 1
    assert (store.get_request_body("r1").response, store.get_request_body("r2").response) == ('{"a": 3}', '{"b": 1}')
    with pytest.raises(InvalidInput, match="NUL"):
        store.keep_request_bodies([kept_body("r3", '{"c": 1}'), kept_body("r4", "\x00")])
    with pytest.raises(NotFound):
        store.get_request_body("r3")  # nothing of a refused batch is kept


async def test_a_listener_whose_connection_broke_listens_again_and_the_followers_read_meanwhile(store: Store) -> None:
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's mark is read on a connection of the store's, not told by a listener")
    before = store.commit_mark()
    listener = store._listener
    assert listener is not None and listener._connection is not None
    pid = listener._connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    with store.engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    await moved(store, before)  # changes made while nothing listened are read once it listens again
    deadline = asyncio.get_running_loop().time() + 10
    while (again := await run_sync(store.commit_mark)) != await run_sync(store.commit_mark):
        assert asyncio.get_running_loop().time() < deadline, "the listener did not listen again"
        await asyncio.sleep(0.1)
    await run_sync(store.create_org, "acme")
    await moved(store, again)
