"""Serve jobs in the store: kept with their audit row, moved on, listed newest first, found unfinished by runner."""

from __future__ import annotations

import json

import pytest

from opod.store import NotFound, Store
from opod.store.audit import AuditRow
from tests.store.conftest import at


def body(job_id: str, state: str) -> str:
    return json.dumps({"id": job_id, "state": state})


def test_a_job_is_kept_moved_on_and_listed_newest_first(store: Store) -> None:
    row = AuditRow(
        actor="ops", source="api", action="POST /api/v1/models/serve", target="job:sj_1", detail="", status=202
    )
    store.add_serve_job("sj_1", body("sj_1", "running"), runner="host:/a", at=at(0), audit=row)
    store.add_serve_job("sj_2", body("sj_2", "running"), runner="host:/b", at=at(5))
    store.put_serve_job("sj_2", "succeeded", body("sj_2", "succeeded"), at=at(9))
    assert [(r.id, r.state) for r in store.list_serve_jobs()] == [("sj_2", "succeeded"), ("sj_1", "running")]
    kept = store.get_serve_job("sj_2")
    assert kept is not None and json.loads(kept.job_json)["state"] == "succeeded" and kept.updated_at == at(9)
    assert [a.target for a in store.list_audit(actor="ops")] == ["job:sj_1"]
    assert [r.id for r in store.unfinished_serve_jobs("host:/a")] == ["sj_1"]
    assert store.unfinished_serve_jobs("host:/b") == []
    assert store.get_serve_job("sj_3") is None
    with pytest.raises(NotFound):
        store.put_serve_job("sj_3", "failed", body("sj_3", "failed"))
