"""Retention by age only: old rows go, recent ones stay however far behind a consumer is."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from opod.ledger import Ledger, retention_days
from opod.store import Store
from opod.store.events import NewEvent
from opod.store.usage import NewUsage
from tests.support.rows import usage_row

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def usage_at(entry: str, ts: datetime) -> NewUsage:
    return usage_row(entry, ts=ts, user_id="u")


def event_at(entry: str, ts: datetime) -> NewEvent:
    return NewEvent(entry=entry, ts=ts, type="node.registered", subject="n", data_json="{}")


async def test_rows_older_than_the_retention_are_deleted_and_no_others(store: Store, open_ledger) -> None:
    ages = {"d45": 45, "d31": 31, "d29": 29, "d1": 1, "now": 0}
    store.append_ledger(
        [usage_at(name, NOW - timedelta(days=days)) for name, days in ages.items()],
        [event_at("e-" + name, NOW - timedelta(days=days)) for name, days in ages.items()],
    )
    ledger: Ledger = open_ledger(keep=timedelta(days=30))
    gone = await ledger.prune(NOW)
    assert (gone.usage, gone.events) == (2, 2)
    assert [r.request_id for r in store.usage_after(0, 10)] == ["d29", "d1", "now"]
    assert [e.entry for e in store.events_after(0, 10)] == ["e-d29", "e-d1", "e-now"]
    # A consumer that never read anything still finds every row inside the retention.
    assert len((await ledger.usage_page(0, 1000)).events) == 3


async def test_retention_deletes_in_batches_until_nothing_old_is_left(store: Store, open_ledger) -> None:
    old = NOW - timedelta(days=400)
    store.append_ledger([usage_at(f"u{i}", old) for i in range(12_000)])  # more than one delete batch
    ledger: Ledger = open_ledger(keep=timedelta(days=30))
    assert (await ledger.prune(NOW)).usage == 12_000
    assert store.usage_after(0, 10) == []


async def test_the_writer_enforces_retention_by_itself(store: Store, open_ledger) -> None:
    store.append_ledger(
        [usage_at("ancient", datetime(2000, 1, 1, tzinfo=UTC))], [event_at("e", datetime(2000, 1, 1, tzinfo=UTC))]
    )
    ledger: Ledger = open_ledger(keep=timedelta(days=1))
    stop = asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    for _ in range(200):
        if not store.usage_after(0, 10) and not store.events_after(0, 10):
            break
        await asyncio.sleep(0.02)
    stop.set()
    await writer
    assert store.usage_after(0, 10) == [] and store.events_after(0, 10) == []


def test_the_retention_comes_from_the_environment() -> None:
    assert retention_days({}) == timedelta(days=30)
    assert retention_days({"OPOD_USAGE_RETENTION_DAYS": " 7 "}) == timedelta(days=7)


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "a week", "99999999"])
def test_a_retention_that_is_not_a_number_of_days_is_refused(value: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"OPOD_USAGE_RETENTION_DAYS=.* is not a number of days; set a whole number from 1 to \d+, or unset it for 30",
    ):
        retention_days({"OPOD_USAGE_RETENTION_DAYS": value})


def test_opening_a_ledger_with_a_bad_retention_says_why(
    store: Store, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPOD_USAGE_RETENTION_DAYS", "forever")
    with pytest.raises(ValueError, match="OPOD_USAGE_RETENTION_DAYS='forever'"):
        Ledger.open(store, tmp_path)
    monkeypatch.setenv("OPOD_USAGE_RETENTION_DAYS", "3")
    ledger = Ledger.open(store, tmp_path)
    assert ledger.keep == timedelta(days=3)
    ledger.close()
