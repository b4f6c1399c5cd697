"""Small leader facts and the boot counter."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from opod.store import InvalidInput, Store, StoreError


def test_meta_values_are_set_read_and_replaced(store: Store) -> None:
    assert store.get_meta("cluster_name") is None
    store.set_meta("cluster_name", "lab")
    store.set_meta("cluster_name", "lab-2")
    store.set_meta("empty", "")
    assert (store.get_meta("cluster_name"), store.get_meta("empty")) == ("lab-2", "")
    with pytest.raises(InvalidInput, match="meta value for 'x' must be text, not int"):
        store.set_meta("x", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="meta key must not be empty"):
        store.set_meta("", "v")


def test_boots_count_up_from_one(store: Store) -> None:
    assert [store.next_boot() for _ in range(3)] == [1, 2, 3]
    assert store.get_meta("boot") == "3"


def test_boot_numbers_stay_distinct_under_concurrent_callers(store: Store) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        boots = list(pool.map(lambda _: store.next_boot(), range(40)))
    assert sorted(boots) == list(range(1, 41))


def test_a_boot_counter_that_is_not_a_number_is_refused_not_reset(store: Store) -> None:
    store.set_meta("boot", "seven")
    with pytest.raises(StoreError, match="meta 'boot' holds 'seven', not a boot number"):
        store.next_boot()
    assert store.get_meta("boot") == "seven"
