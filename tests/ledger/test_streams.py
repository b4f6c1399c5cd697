"""The cursor streams: durable before offered, paging, limits, ids, boot, the wire shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from opod.contract.adminapi import EventsBatch, UsageBatch
from opod.ledger import CursorError, Ledger, parse_after, parse_limit
from opod.store import Store
from tests.ledger.conftest import request


async def test_a_row_is_offered_only_once_it_is_committed(ledger: Ledger, home) -> None:
    ticket = ledger.begin(request_id="r-1", api_key_id="k_1", user_id="u_1", model="m", protocol="openai")
    ledger.end(ticket, outcome="ok", prompt_tokens=7, completion_tokens=9, latency_ms=120, ttft_ms=30, node_id="n1")
    # end() returned: the row is in the journal on disk, but not yet in the store, so not offered.
    assert b'"request_id":"r-1"' in b"".join(p.read_bytes() for p in (home / "ledger").glob("journal-*.jsonl"))
    page = await ledger.usage_page(0, None)
    assert page.events == [] and page.next == 0 and page.more is False
    await ledger.flush()
    page = await ledger.usage_page(0, None)
    assert [e.data.model_dump() for e in page.events] == [
        {
            "api_key_id": "k_1",
            "ttft_ms": 30,
            "user_id": "u_1",
            "model": "m",
            "protocol": "openai",
            "prompt_tokens": 7,
            "completion_tokens": 9,
            "latency_ms": 120,
            "outcome": "ok",
            "cost_usd": 0.0,
            "node_id": "n1",
            "request_id": "r-1",
        }
    ]
    assert page.next == page.events[0].id and page.more is False


async def test_pages_walk_every_row_once_across_more_than_1000(ledger: Ledger) -> None:
    request(ledger, 2345)
    await ledger.flush()
    seen: list[int] = []
    pages = []
    after = 0
    while True:
        page = await ledger.usage_page(after, 1000)
        pages.append((len(page.events), page.more))
        seen += [e.id for e in page.events]
        assert page.next == (page.events[-1].id if page.events else after)
        after = page.next
        if not page.more:
            break
    assert pages == [(1000, True), (1000, True), (345, False)]
    assert len(seen) == len(set(seen)) == 2345 and seen == sorted(seen)
    tokens = [e.data.prompt_tokens for e in (await ledger.usage_page(0, 3)).events]
    assert tokens == [0, 1, 2]
    empty = await ledger.usage_page(after, 1000)
    assert (empty.events, empty.next, empty.more) == ([], after, False)


async def test_limit_defaults_to_500_and_is_clamped_to_1000(ledger: Ledger) -> None:
    request(ledger, 1200)
    await ledger.flush()
    assert len((await ledger.usage_page(0, None)).events) == 500
    assert len((await ledger.usage_page(0, 0)).events) == 500  # 0 is Go's "not said"
    assert len((await ledger.usage_page(0, 5000)).events) == 1000
    assert len((await ledger.usage_page("0", "7")).events) == 7  # query-string values are accepted as text
    page = await ledger.usage_page(0, 1200)
    assert len(page.events) == 1000 and page.more is True


@pytest.mark.parametrize(
    ("after", "limit", "field", "message"),
    [
        (0, -1, "limit", "limit must be a whole number of rows from 1 to 1000 (default 500); -1 is negative"),
        (0, "abc", "limit", "limit must be a whole number of rows from 1 to 1000 (default 500), not 'abc'"),
        (0, "1.5", "limit", "not '1.5'"),
        (0, True, "limit", "not True"),
        (-5, None, "after", "after must be a row id ≥ 0 (the `next` of the previous page; 0 to start); -5 is negative"),
        ("x", None, "after", "not 'x'"),
        (2**63, None, "after", "fits 64 bits"),
    ],
)
async def test_a_bad_cursor_is_refused_naming_the_field(
    ledger: Ledger, after: object, limit: object, field: str, message: str
) -> None:
    for page in (ledger.usage_page, ledger.events_page):
        with pytest.raises(CursorError) as caught:
            await page(after, limit)  # type: ignore[arg-type]
        assert caught.value.field == field and message in str(caught.value)
        assert isinstance(caught.value, ValueError)


def test_cursor_parsing_alone() -> None:
    assert (parse_after(None), parse_after(""), parse_after(" 42 ")) == (0, 0, 42)
    assert (parse_limit(None), parse_limit(""), parse_limit(1), parse_limit(1000), parse_limit(1001)) == (
        500,
        500,
        1,
        1000,
        1000,
    )


async def test_events_have_their_own_ids(ledger: Ledger) -> None:
    ledger.event("node.registered", "n1", {"hostname": "gpu-1", "gpus": 2})
    request(ledger, 3)
    ledger.event("node.drained", "n1")
    ledger.event("model.loaded", "m", {"when": datetime(2026, 1, 2, tzinfo=UTC)})  # not JSON: written as text
    await ledger.flush()
    usage, events = await ledger.usage_page(0, None), await ledger.events_page(0, None)
    assert [e.id for e in usage.events] == [1, 2, 3]
    assert [(e.id, e.type, e.subject, e.data) for e in events.events] == [
        (1, "node.registered", "n1", {"hostname": "gpu-1", "gpus": 2}),
        (2, "node.drained", "n1", {}),
        (3, "model.loaded", "m", {"when": "2026-01-02 00:00:00+00:00"}),
    ]
    assert events.next == 3 and not events.more
    assert [e.id for e in (await ledger.events_page(1, 1)).events] == [2]


async def test_the_wire_shape_carries_opods_route_and_request_id_and_round_trips(ledger: Ledger) -> None:
    ticket = ledger.begin(request_id="r", api_key_id="k_cp_alice", user_id="", model="m", protocol="openai")
    ledger.end(
        ticket,
        outcome="ok",
        prompt_tokens=1,
        completion_tokens=2,
        latency_ms=3,
        route={"worker": "n1", "reason": "prefix"},
    )
    ledger.event("node.removed", "n1")
    await ledger.flush()
    page = await ledger.usage_page(0, None)
    text = page.to_json()
    assert '"ttft_ms"' not in text  # omitempty: a non-streamed answer
    # opod's additive keys: a manager's decoder ignores them, opod's own tools read them.
    assert page.events[0].data.route == {"worker": "n1", "reason": "prefix"} and page.events[0].data.request_id == "r"
    assert '"cost_usd":0' in text and f'"boot":{ledger.boot}' in text
    assert UsageBatch.from_wire(json.loads(text)) == page
    events = await ledger.events_page(0, None)
    assert EventsBatch.from_wire(json.loads(events.to_json())) == events
    # The route is kept for opod itself, in its own column.
    [row] = ledger.store.usage_after(0, 10)
    assert json.loads(row.route_json or "") == {"worker": "n1", "reason": "prefix"} and row.request_id == "r"


async def test_boot_changes_with_every_open_and_ids_never_restart(
    store: Store, home, open_ledger: Callable[..., Ledger]
) -> None:
    first = open_ledger()
    request(first, 3)
    await first.flush()
    first.close()
    second = open_ledger()
    assert second.boot != first.boot and second.boot > 0
    request(second, 2)
    await second.flush()
    page = await second.usage_page(0, None)
    assert [e.id for e in page.events] == [1, 2, 3, 4, 5] and page.boot == second.boot
    second.close()
    # Retention may delete every row; the next ids still continue after the last one handed out.
    assert store.delete_usage_before(datetime(2100, 1, 1, tzinfo=UTC)) == 5
    third = open_ledger(boot=77)
    assert third.boot == 77
    request(third, 1)
    await third.flush()
    assert [e.id for e in (await third.usage_page(0, None)).events] == [6]


@pytest.mark.parametrize("boot", [0, -1, 2**63, True, "3"])
def test_a_boot_that_is_not_a_positive_int64_is_refused(open_ledger: Callable[..., Ledger], boot: object) -> None:
    with pytest.raises(ValueError, match="boot must be a whole number from 1 to"):
        open_ledger(boot=boot)
    open_ledger(boot=1).close()  # and the failed open left the directory usable
