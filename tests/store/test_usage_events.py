"""The usage and events tables: idempotent appends, all-or-nothing batches, cursor reads, retention
deletes, ids that are never reused and that commit in order under concurrent writers."""

from __future__ import annotations

import threading
import time
from dataclasses import fields, replace
from datetime import datetime

import pytest

from opod.store import InvalidInput, Store
from opod.store.base import MAX_TEXT
from opod.store.events import NewEvent
from opod.store.usage import USAGE_COLUMNS, USAGE_COUNTS, USAGE_JSON, USAGE_TEXTS, NewUsage
from tests.store.conftest import T0, at


def usage(entry: str, ts: datetime = T0, **changes: object) -> NewUsage:
    row = NewUsage(
        entry=entry,
        request_id=f"req-{entry}",
        ts=ts,
        api_key_id="k_1",
        user_id="u_1",
        model="m",
        protocol="openai",
        prompt_tokens=10,
        completion_tokens=20,
        latency_ms=300,
        ttft_ms=40,
        outcome="ok",
        node_id="n1",
        route_json='{"worker": "n1"}',
    )
    return replace(row, **changes)  # type: ignore[arg-type]


def event(entry: str, ts: datetime = T0, **changes: object) -> NewEvent:
    return replace(
        NewEvent(entry=entry, ts=ts, type="node.registered", subject="n1", data_json='{"hostname": "h"}'), **changes
    )  # type: ignore[arg-type]


def test_rows_and_events_are_stored_with_their_own_ids(store: Store) -> None:
    assert store.append_ledger([usage("a"), usage("b", at(1))], [event("e1")]) == (2, 1)
    assert store.append_ledger([], [event("e2", at(2), type="node.drained", data_json="{}")]) == (0, 1)
    rows, events = store.usage_after(0, 10), store.events_after(0, 10)
    assert [(r.id, r.entry, r.ts) for r in rows] == [(1, "a", T0), (2, "b", at(1))]
    assert rows[0].route_json == '{"worker": "n1"}' and rows[0].request_id == "req-a" and rows[0].ttft_ms == 40
    assert [(e.id, e.type, e.data_json) for e in events] == [
        (1, "node.registered", '{"hostname": "h"}'),
        (2, "node.drained", "{}"),
    ]


def test_appending_the_same_entries_again_stores_nothing_twice(store: Store) -> None:
    batch = [usage(f"u{i}") for i in range(5)]
    assert store.append_ledger(batch, [event("e")]) == (5, 1)
    assert store.append_ledger([*batch, usage("u5")], [event("e")]) == (1, 0)
    assert [r.entry for r in store.usage_after(0, 10)] == ["u0", "u1", "u2", "u3", "u4", "u5"]
    assert [r.id for r in store.usage_after(0, 10)] == [1, 2, 3, 4, 5, 6]  # replays consume no ids
    assert len(store.events_after(0, 10)) == 1


def test_a_bad_row_stores_nothing_of_its_batch(store: Store) -> None:
    with pytest.raises(InvalidInput, match="prompt_tokens must be a whole number, not str"):
        store.append_ledger([usage("a"), usage("b", prompt_tokens="7")], [event("e")])
    with pytest.raises(InvalidInput, match="data_json of event 'node.registered' must be a JSON object"):
        store.append_ledger([usage("a")], [event("e", data_json="[]")])
    assert store.usage_after(0, 10) == [] and store.events_after(0, 10) == []


def test_rows_not_looked_up_first_are_still_stored_once_and_counted_exactly(store: Store) -> None:
    # The live ledger's batches skip the look-up of known entries; a batch retried after a commit
    # that did land must still store nothing twice, and say so.
    batch = [usage(f"t{i}") for i in range(3)]
    assert store.append_ledger(batch, [event("e")], check_known=False) == (3, 1)
    assert store.append_ledger([*batch, usage("t3")], [event("e")], check_known=False) == (1, 0)
    assert [r.entry for r in store.usage_after(0, 10)] == ["t0", "t1", "t2", "t3"]
    assert len(store.events_after(0, 10)) == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"entry": ""}, "usage entry must not be empty"),
        ({"ts": datetime(2026, 1, 1)}, "usage ts .* has no timezone"),
        ({"latency_ms": -1}, "latency_ms is -1; it must be from 0 to"),
        ({"ttft_ms": True}, "ttft_ms must be a whole number, not bool"),
        ({"completion_tokens": 2**63}, "completion_tokens is 9223372036854775808"),
        ({"model": "m" * 1025}, "model is 1025 characters long"),
        ({"outcome": ""}, "outcome of usage entry 'x' must not be empty"),
        ({"route_json": "{"}, "route_json of usage entry 'x' is not valid JSON"),
        ({"node_id": "n\x00"}, "node_id contains a NUL character"),
        ({"guard_category": "\x00"}, "guard_category contains a NUL character"),
        ({"request_id": None}, "request_id must be text, not NoneType"),
        ({"status": 1.5}, "status must be a whole number, not float"),
        ({"guard_ms": 2**63}, "guard_ms is 9223372036854775808"),
        ({"tags_json": "nope"}, "tags_json of usage entry 'x' is not valid JSON"),
    ],
)
def test_bad_usage_values_are_refused_naming_the_field(store: Store, changes: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        store.append_ledger([replace(usage("x"), **changes)])


def test_the_usage_rule_names_each_column_once() -> None:
    named = ["entry", "ts", "outcome", "cache_hit", *USAGE_TEXTS, *USAGE_COUNTS, *USAGE_JSON]
    assert sorted(named) == sorted(USAGE_COLUMNS) == sorted(field.name for field in fields(NewUsage))


def test_text_at_the_limit_in_every_column_is_stored(store: Store) -> None:
    # Long all together, each within the limit: the check of the whole row must not refuse what each column allows.
    long = {name: name[0] * MAX_TEXT for name in USAGE_TEXTS}
    assert store.append_ledger([usage("e" * MAX_TEXT, **long, outcome="o" * MAX_TEXT)]) == (1, 0)
    [row] = store.usage_after(0, 1)
    assert {name: getattr(row, name) for name in long} == long and row.outcome == "o" * MAX_TEXT


def test_reads_page_by_id(store: Store) -> None:
    store.append_ledger([usage(f"u{i}") for i in range(25)], [event(f"e{i}") for i in range(3)])
    assert [r.id for r in store.usage_after(20, 3)] == [21, 22, 23]
    assert [r.id for r in store.usage_after(23, 100)] == [24, 25]
    assert store.usage_after(25, 100) == []
    assert [e.id for e in store.events_after(1, 1)] == [2]
    with pytest.raises(InvalidInput, match="limit is 0; ask for 1 to 10000 rows at a time"):
        store.usage_after(0, 0)
    with pytest.raises(InvalidInput, match="after is -1; it must be from 0 to"):
        store.events_after(-1, 10)


def test_retention_deletes_old_rows_only_in_bounded_batches(store: Store) -> None:
    store.append_ledger(
        [usage(f"old{i}", at(i)) for i in range(5)] + [usage("new", at(100))],
        [event("old", at(0)), event("new", at(100))],
    )
    assert store.delete_usage_before(at(3), limit=2) == 2
    assert store.delete_usage_before(at(3)) == 1
    assert store.delete_usage_before(at(3)) == 0
    assert [r.entry for r in store.usage_after(0, 10)] == ["old3", "old4", "new"]
    assert store.delete_events_before(at(50)) == 1 and [e.entry for e in store.events_after(0, 10)] == ["new"]
    with pytest.raises(InvalidInput, match="cutoff .* has no timezone"):
        store.delete_usage_before(datetime(2026, 1, 1))


def test_ids_are_never_handed_out_twice_even_after_the_newest_rows_are_deleted(store: Store) -> None:
    store.append_ledger([usage("a"), usage("b")], [event("e")])
    assert store.delete_usage_before(at(1)) == 2 and store.delete_events_before(at(1)) == 1
    store.append_ledger([usage("c", at(2))], [event("f", at(2))])
    assert [r.id for r in store.usage_after(0, 10)] == [3] and [e.id for e in store.events_after(0, 10)] == [2]


def test_a_reader_following_concurrent_writers_never_skips_a_row(open_store) -> None:
    # Two writers (two leaders on one database) append while a reader follows the cursor. Without
    # appends committing in id order, the reader could pass an id whose row commits later.
    writers, per_writer, batch = 4, 150, 5
    reader_store = open_store()
    stores = [open_store() for _ in range(writers)]
    done = threading.Event()

    def write(n: int) -> None:
        for i in range(0, per_writer, batch):
            stores[n].append_ledger([usage(f"w{n}-{j}") for j in range(i, i + batch)])

    seen: list[int] = []

    def read() -> None:
        after = 0
        while True:
            finished = done.is_set()
            page = reader_store.usage_after(after, 1000)
            seen.extend(r.id for r in page)
            after = page[-1].id if page else after
            if finished and not page:
                return
            time.sleep(0.0005)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    follower = threading.Thread(target=read)
    follower.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    follower.join(timeout=60)
    assert sorted(seen) == seen and len(seen) == writers * per_writer
    assert set(seen) == {r.id for r in reader_store.usage_after(0, 1000)}
