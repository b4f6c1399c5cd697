"""The settings in force on a leader: loaded from the store, swapped whole, followed from another writer within 2 s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings
from opod.store import Store
from opod.store.following import Following


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{tmp_path / 'opod.db'}")
    yield opened
    opened.close()


def test_with_nothing_stored_every_default_is_in_force(store: Store) -> None:
    holder = SettingsHolder(store)
    holder.load()
    assert (holder.version, holder.current) == (0, ClusterSettings())


def test_load_takes_the_newest_version(store: Store) -> None:
    store.put_settings(0, "retention: {requests_days: 3}\n", by="alice")
    store.put_settings(1, "retention: {requests_days: 9}\n", by="alice")
    holder = SettingsHolder(store)
    holder.load()
    assert (holder.version, holder.current.retention.requests_days) == (2, 9)


def test_a_change_swaps_the_whole_object_and_calls_subscribers(store: Store) -> None:
    holder = SettingsHolder(store)
    holder.load()
    before = holder.current
    seen: list[ClusterSettings] = []
    holder.subscribe(seen.append)
    store.put_settings(0, "prices: {'*': {input_per_million: 2}}\n", by="bob")
    assert holder.refresh() is True
    assert before == ClusterSettings()  # a reader holding the old object still sees the old version, whole
    assert holder.current is not before and holder.current.price("m").input_per_million == 2
    assert seen == [holder.current]
    assert holder.refresh() is False  # nothing newer: no call
    assert len(seen) == 1


def test_an_older_version_never_replaces_a_newer_one() -> None:
    holder = SettingsHolder()
    newer = ClusterSettings.model_validate({"retention": {"requests_days": 5}})
    assert holder.apply(3, newer)
    assert not holder.apply(2, ClusterSettings())
    assert holder.current is newer and holder.version == 3


def test_a_failing_subscriber_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    holder = SettingsHolder()
    seen: list[int] = []

    def broken(_: ClusterSettings) -> None:
        raise RuntimeError("boom")

    holder.subscribe(broken)
    holder.subscribe(lambda s: seen.append(s.retention.requests_days))
    with caplog.at_level(logging.ERROR, "opod.settings"):
        holder.apply(1, ClusterSettings())
    assert seen == [30] and "subscriber failed" in caplog.text


def test_local_keys_win_over_the_stored_body(store: Store) -> None:
    store.put_settings(0, "prometheus: {url: 'http://stored:9090'}\nretention: {bodies: true}\n", by="alice")
    holder = SettingsHolder(store, local={"prometheus.url": "http://mine:9090"})
    holder.load()
    assert holder.current.prometheus.url == "http://mine:9090"
    assert holder.current.retention.bodies is True
    assert holder.local_keys == ["prometheus.url"]


def test_a_bad_local_override_fails_at_start() -> None:
    with pytest.raises(ValueError, match="prometheus.url"):
        SettingsHolder(local={"prometheus.url": "ftp://nope"})


def test_a_stored_body_this_release_cannot_read_is_skipped_not_applied(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.put_settings(0, "retention: {requests_days: 4}\n", by="alice")
    holder = SettingsHolder(store)
    holder.load()
    store.put_settings(1, "a_key_from_a_newer_release: 1\n", by="newer-opod")
    with caplog.at_level(logging.ERROR, "opod.settings"):
        assert holder.refresh() is False
        assert holder.refresh() is False
    assert (holder.version, holder.current.retention.requests_days) == (1, 4)
    assert caplog.text.count("not in force") == 1  # said once, not every poll


def test_following_the_store_brings_a_write_from_another_store_within_two_seconds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"

    async def scenario() -> float:
        with Store.open(url) as ours, Store.open(url) as theirs:
            holder = SettingsHolder(ours)
            holder.load()
            changed = asyncio.Event()
            holder.subscribe(lambda _: changed.set())
            following = Following(ours, every=0.2)
            following.add("the settings", holder.follow)
            stop = asyncio.Event()
            running = asyncio.create_task(following.run(stop))
            try:
                written = time.monotonic()
                await asyncio.to_thread(theirs.put_settings, 0, "retention: {bodies_days: 2}\n", by="other-leader")
                await asyncio.wait_for(changed.wait(), 2.0)
                took = time.monotonic() - written
            finally:
                stop.set()
                await running
            assert holder.current.retention.bodies_days == 2
            return took

    assert asyncio.run(scenario()) < 2.0


def test_the_environment_names_the_local_keys() -> None:
    from opod import config

    assert config.local_settings({"OPOD_PROMETHEUS_URL": " http://p:9090 "}) == {"prometheus.url": "http://p:9090"}
    assert config.local_settings({}) == {}
