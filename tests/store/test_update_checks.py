"""The registry's last answer for each model, kept so every leader lists the same: replaced by the next check."""

from __future__ import annotations

import json

from opod.store import Store
from tests.store.conftest import at


def test_a_model_s_check_is_kept_and_replaced_by_the_next(store: Store) -> None:
    assert store.update_checks() == {}
    store.put_update_check("tiny", json.dumps({"model": "tiny", "available": False}), at=at(0))
    store.put_update_check("other", json.dumps({"model": "other"}), at=at(1))
    store.put_update_check("tiny", json.dumps({"model": "tiny", "available": True}), at=at(2))
    kept = store.update_checks()
    assert set(kept) == {"tiny", "other"} and json.loads(kept["tiny"])["available"] is True
