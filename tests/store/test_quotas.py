"""Capacity quotas in the store: replaced whole, None ungoverned, refused whole, audited in the same transaction."""

from __future__ import annotations

import pytest

from opod.store import InvalidInput, NotFound, QuotaAmounts, QuotaRecord, Store
from opod.store.audit import AuditRow
from tests.store.conftest import at


def row(action: str, target: str) -> AuditRow:
    return AuditRow(
        actor="ops@example.com", source="api", action=action, target=target, detail="{}", status=200, at=at(5)
    )


def test_a_quota_reads_back_with_every_amount_and_none_as_ungoverned(store: Store) -> None:
    put = store.put_quota(
        "team:t1",
        "team",
        QuotaAmounts(gpus=2),
        QuotaAmounts(gpus=4, cpu_cores=64, memory_gb=512),
        by="ops@example.com",
        at=at(1),
    )
    assert put == QuotaRecord(
        scope="team:t1",
        kind="team",
        guarantee=QuotaAmounts(gpus=2, cpu_cores=None, memory_gb=None),
        limit=QuotaAmounts(gpus=4, cpu_cores=64, memory_gb=512),
        updated_by="ops@example.com",
        updated_at=at(1),
    )
    assert store.get_quota("team:t1") == put and store.list_quotas() == [put]
    assert store.get_quota("team:nobody") is None
    assert put.guarantee.governed() and not QuotaAmounts().governed()


def test_a_put_replaces_the_whole_quota(store: Store) -> None:
    store.put_quota("team:t1", "team", QuotaAmounts(gpus=2), QuotaAmounts(gpus=4, cpu_cores=8), by="a", at=at(1))
    again = store.put_quota("team:t1", "team", QuotaAmounts(), QuotaAmounts(memory_gb=100), by="b", at=at(2))
    assert again.guarantee == QuotaAmounts() and again.limit == QuotaAmounts(memory_gb=100)
    assert (again.updated_by, again.updated_at) == ("b", at(2))
    assert store.list_quotas() == [again]


def test_zero_is_a_limit_and_not_the_same_as_none(store: Store) -> None:
    zero = store.put_quota("org:o1", "org", QuotaAmounts(), QuotaAmounts(gpus=0), by="a")
    assert zero.limit.gpus == 0 and zero.limit.cpu_cores is None


@pytest.mark.parametrize(
    ("guarantee", "limit", "message"),
    [
        (QuotaAmounts(gpus=-1), QuotaAmounts(), "guarantee.gpus: -1 is not an amount"),
        (QuotaAmounts(), QuotaAmounts(cpu_cores=2.5), "limit.cpu_cores: 2.5 is not an amount"),  # type: ignore[arg-type]
        (QuotaAmounts(gpus=8), QuotaAmounts(gpus=4), "guarantee.gpus: 8 is above limit.gpus 4"),
    ],
)
def test_a_bad_amount_is_refused_and_nothing_is_written(store: Store, guarantee, limit, message) -> None:
    store.put_quota("team:t1", "team", QuotaAmounts(gpus=1), QuotaAmounts(gpus=2), by="a", at=at(1))
    with pytest.raises(InvalidInput, match=message):
        store.put_quota("team:t1", "team", guarantee, limit, by="b", audit=row("PUT /api/v1/quotas", "team:t1"))
    assert store.get_quota("team:t1").limit == QuotaAmounts(gpus=2)
    assert store.list_audit(since=at(0), limit=10, actor=None, contains=None) == []


def test_a_scope_kind_other_than_org_team_or_project_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInput, match="quota scope kind 'user' is not one of org, team, project"):
        store.put_quota("user:u1", "user", QuotaAmounts(), QuotaAmounts(gpus=1), by="a")


def test_a_change_and_its_audit_row_commit_together(store: Store) -> None:
    store.put_quota(
        "team:t1", "team", QuotaAmounts(), QuotaAmounts(gpus=4), by="ops", audit=row("PUT /api/v1/quotas", "team:t1")
    )
    removed = store.remove_quota("team:t1", audit=row("DELETE /api/v1/quotas/{scope}", "team:t1"))
    assert removed.limit.gpus == 4 and store.list_quotas() == []
    actions = [(r.action, r.target) for r in store.list_audit(since=at(0), limit=10, actor=None, contains=None)]
    assert sorted(actions) == [("DELETE /api/v1/quotas/{scope}", "team:t1"), ("PUT /api/v1/quotas", "team:t1")]


def test_removing_a_quota_that_is_not_there_is_not_found_and_writes_no_audit(store: Store) -> None:
    with pytest.raises(NotFound, match="'team:t9': the scope has no quota"):
        store.remove_quota("team:t9", audit=row("DELETE /api/v1/quotas/{scope}", "team:t9"))
    assert store.list_audit(since=at(0), limit=10, actor=None, contains=None) == []


def test_quotas_are_kept_across_a_reopen(open_store) -> None:
    first = open_store()
    first.put_quota("project:p1", "project", QuotaAmounts(cpu_cores=4), QuotaAmounts(cpu_cores=16), by="a", at=at(3))
    first.close()
    assert open_store().get_quota("project:p1").guarantee == QuotaAmounts(cpu_cores=4)
