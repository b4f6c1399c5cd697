"""A request's record (status, served model, queue time, end user, tags, cache hit) travels through the
journal and survives a crash; its kept body is written off the request path and deleted once expired."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import astuple
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from opod.ledger import Ledger
from opod.ledger.bodies import BodyKeeper, OfferedBody, stored
from opod.store import NotFound, RequestBody, Store


def body(request_id: str, *, at: datetime | None = None, days: int = 7, text: str = "{}") -> RequestBody:
    at = at or datetime.now(UTC)
    return RequestBody(
        request_id=request_id,
        project_id="p",
        at=at,
        expires_at=at + timedelta(days=days),
        path="/v1/chat/completions",
        model="m",
        served_model="m",
        status=200,
        request=text,
        response="hi",
        truncated=False,
    )


def row(request_id: str, *, text: str = "{}") -> OfferedBody:
    """A body as the gateway offers it: its row's values, its times in POSIX seconds."""
    values = astuple(body(request_id, text=text))
    return (*values[:2], values[2].timestamp(), values[3].timestamp(), *values[4:])  # type: ignore[return-value]


def test_an_offered_body_is_stored_with_its_times_in_utc() -> None:
    offered = row("r")
    stored_row = stored(offered)
    at, expires_at = stored_row[2], stored_row[3]
    assert at.tzinfo is UTC and abs(at.timestamp() - offered[2]) < 1e-6
    assert abs((expires_at - at) - timedelta(days=7)) <= timedelta(microseconds=1)
    assert stored_row[:2] + stored_row[4:] == offered[:2] + offered[4:]


async def test_an_ended_request_keeps_its_record_fields(ledger: Ledger, store: Store) -> None:
    ticket = ledger.begin(
        request_id="r",
        api_key_id="k_1",
        user_id="u_1",
        model="m",
        protocol="openai",
        end_user="alice",
        tags={"feature": "search"},
    )
    ledger.end(
        ticket,
        outcome="ok",
        prompt_tokens=3,
        completion_tokens=4,
        latency_ms=5,
        node_id="n1",
        details={"status": 200, "served_model": "m-fallback", "queue_ms": 12, "cache_hit": True, "body_state": "kept"},
    )
    plain = ledger.begin(request_id="plain", api_key_id="k_2", user_id="", model="m", protocol="openai")
    ledger.end(plain, outcome="error", prompt_tokens=0, completion_tokens=0, latency_ms=1)
    await ledger.flush()
    row = store.find_request("r")
    assert (row.status, row.served_model, row.queue_ms, row.cache_hit, row.body_state) == (
        200,
        "m-fallback",
        12,
        True,
        "kept",
    )
    assert (row.end_user, json.loads(row.tags_json or "null"), row.node_id) == ("alice", {"feature": "search"}, "n1")
    bare = store.find_request("plain")
    assert (bare.status, bare.served_model, bare.end_user, bare.tags_json, bare.cache_hit) == (0, "", "", None, False)


def test_a_crash_keeps_the_record_fields_of_ended_and_interrupted_requests(
    store: Store, home: Path, open_ledger: Callable[..., Ledger]
) -> None:
    first = Ledger.open(store, home, keep=timedelta(days=1))
    first.begin(
        request_id="cut", api_key_id="k", user_id="u", model="m", protocol="openai", end_user="bob", tags={"run": "7"}
    )
    ended = first.begin(request_id="ended", api_key_id="k", user_id="u", model="m", protocol="openai", end_user="eve")
    first.end(
        ended,
        outcome="ok",
        prompt_tokens=1,
        completion_tokens=1,
        latency_ms=2,
        node_id="n1",
        details={"status": 200, "served_model": "m2", "queue_ms": 40, "cache_hit": True, "body_state": "no_store"},
    )
    first.journal.close()  # the process dies: one request in flight, one ended but not committed
    open_ledger()
    row = store.find_request("cut")
    assert (row.outcome, row.end_user, json.loads(row.tags_json or "null")) == ("interrupted", "bob", {"run": "7"})
    done = store.find_request("ended")
    assert (done.status, done.served_model, done.queue_ms, done.cache_hit, done.body_state, done.end_user) == (
        200,
        "m2",
        40,
        True,
        "no_store",
        "eve",
    )


async def test_find_request_answers_the_newest_row_of_a_reused_id(ledger: Ledger, store: Store) -> None:
    for tokens in (1, 2):
        ticket = ledger.begin(request_id="same", api_key_id="k", user_id="", model="m", protocol="openai")
        ledger.end(ticket, outcome="ok", prompt_tokens=tokens, completion_tokens=tokens, latency_ms=1)
    await ledger.flush()
    assert store.find_request("same").prompt_tokens == 2
    with pytest.raises(NotFound, match="never"):
        store.find_request("never")


async def test_bodies_are_written_in_batches_and_a_full_queue_drops_and_counts(store: Store) -> None:
    keeper = BodyKeeper(store, max_waiting=2)
    assert keeper.offer(row("a")) and keeper.offer(row("b"))
    assert not keeper.offer(row("c"))
    assert keeper.dropped == 1
    await keeper.flush()
    assert (store.get_request_body("a").response, keeper.written, keeper.waiting) == ("hi", 2, 0)
    store.keep_request_bodies([body("a", text='{"again": true}')])  # a reused request id: the newest body is kept
    assert store.get_request_body("a").request == '{"again": true}'
    # Twice in one batch, and beside a new one: one statement for the batch, the last body of an id kept.
    written = store.keep_request_bodies(
        [body("a", text='{"third": 1}'), body("b", text='{"b": 1}'), body("a", text='{"fourth": 1}')]
    )
    assert written == 2 and store.get_request_body("a").request == '{"fourth": 1}'
    assert store.get_request_body("b").request == '{"b": 1}'


async def test_bodies_the_store_refuses_are_dropped_and_counted_never_raised(store: Store) -> None:
    keeper = BodyKeeper(store)
    bad = (*row("bad")[:-3], "a\x00b", "hi", False)  # a request body with a NUL: no gateway makes one
    assert keeper.offer(row("good")) and keeper.offer(bad)  # type: ignore[arg-type]
    await keeper.flush()
    assert (keeper.dropped, keeper.written, keeper.waiting) == (2, 0, 0)  # its batch goes with it
    with pytest.raises(NotFound):
        store.get_request_body("good")


async def test_the_running_writer_keeps_bodies_with_its_rows_and_alone(ledger: Ledger, store: Store) -> None:
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    try:
        ticket = ledger.begin(request_id="with-row", api_key_id="", user_id="", model="m", protocol="openai")
        ledger.end(ticket, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)
        assert ledger.bodies.offer(row("with-row"))
        await _until(lambda: ledger.bodies.written == 1)
        assert store.find_request("with-row").outcome == "ok"
        assert store.get_request_body("with-row").response == "hi"
        assert ledger.bodies.offer(row("alone"))  # no usage row to commit beside it: written all the same
        await _until(lambda: ledger.bodies.written == 2)
        assert ledger.bodies.offer(row("at-stop"))
    finally:
        stop.set()
        await writer
    assert store.get_request_body("at-stop").request_id == "at-stop"


async def _until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def test_retention_deletes_expired_bodies_only(ledger: Ledger, store: Store) -> None:
    now = datetime.now(UTC)
    store.keep_request_bodies([body("old", at=now - timedelta(days=8), days=7), body("fresh", at=now, days=7)])
    gone = await ledger.prune(now)
    assert gone.bodies == 1
    assert store.get_request_body("fresh").request_id == "fresh"
    with pytest.raises(NotFound):
        store.get_request_body("old")
