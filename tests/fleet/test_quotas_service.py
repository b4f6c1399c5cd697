"""Capacity quotas through their one writer, on a real store and a real tenancy tree: the store and its audit row
first, then the table placement reads, then the reconciler; a refusal changes neither and leaves the audit to the
listener; another leader's changes are followed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from opod.access.tenancy import Tenancy, TenancyScopes
from opod.fleet.quotas import Amount, Bounds, Quota, QuotaTable
from opod.fleet.quotas_service import QuotasService, QuotaStanding, load_quotas
from opod.store import InvalidInput, NotFound, QuotaAmounts, Store
from opod.store.audit import SOURCE_API, AuditDraft


class Reconciler:
    """What the quotas ask of the reconciler: a round soon, and what each scope holds."""

    def __init__(self) -> None:
        self.kicks = 0
        self.holds: dict[str, Amount] = {}

    def kick(self) -> None:
        self.kicks += 1

    def quota_holds(self) -> Mapping[str, Amount]:
        return self.holds


class Parts:
    def __init__(self, tmp_path: Path) -> None:
        self.store = Store.open(None, home=tmp_path)
        self.tenancy = Tenancy.load(self.store)
        self.table = load_quotas(self.store)
        self.reconciler = Reconciler()
        self.service = QuotasService(
            self.store, self.table, scopes=TenancyScopes(self.tenancy), reconciler=self.reconciler
        )


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    made = Parts(tmp_path)
    yield made
    made.store.close()


def draft(action: str = "PUT /api/v1/quotas") -> AuditDraft:
    return AuditDraft(actor="ops@example.com", source=SOURCE_API, action=action, body={"sent": True})


async def acme_ml(parts: Parts) -> tuple[str, str]:
    """``org:ID`` of acme and ``team:ID`` of its team ml."""
    org = await parts.tenancy.create("org", "acme", None)
    team = await parts.tenancy.create("team", "ml", "acme")
    return f"org:{org.id}", f"team:{team.id}"


async def test_a_quota_put_by_path_is_kept_by_id_with_its_row_then_placed_by(parts: Parts) -> None:
    _, ml = await acme_ml(parts)
    audit = draft()
    record = await parts.service.put("team:acme/ml", QuotaAmounts(gpus=1), QuotaAmounts(gpus=2, memory_gb=64), audit)
    assert record.scope == ml and record.kind == "team" and record.updated_by == "ops@example.com"
    assert parts.store.get_quota(ml) == record
    assert parts.table.get(ml) == Quota(ml, Bounds(gpus=1), Bounds(gpus=2, memory_gb=64))
    assert parts.reconciler.kicks == 1 and audit.committed
    [row] = parts.store.list_audit(limit=10)
    assert (row.action, row.target, row.status) == ("PUT /api/v1/quotas", ml, 200)
    assert row.detail == '{"guarantee":{"gpus":1},"limit":{"gpus":2,"memory_gb":64},"scope":"team:acme/ml"}'


async def test_standings_name_each_scope_and_say_what_it_holds(parts: Parts) -> None:
    acme, ml = await acme_ml(parts)
    await parts.service.put(acme, QuotaAmounts(), QuotaAmounts(gpus=8), draft())
    await parts.service.put(ml, QuotaAmounts(), QuotaAmounts(gpus=2), draft())
    parts.reconciler.holds = {ml: Amount(gpus=2, cpu_cores=4)}
    standings = await parts.service.standings()
    assert [(s.record.scope, s.name, s.holds) for s in standings] == sorted(
        [(acme, "acme", Amount()), (ml, "acme / ml", Amount(gpus=2, cpu_cores=4))]
    )
    assert all(isinstance(s, QuotaStanding) for s in standings)


@pytest.mark.parametrize(
    ("scope", "guarantee", "limit", "refusal", "message"),
    [
        ("team:acme/nope", QuotaAmounts(), QuotaAmounts(gpus=1), NotFound, "no team"),
        ("user:someone", QuotaAmounts(), QuotaAmounts(gpus=1), InvalidInput, "scope"),
        (None, QuotaAmounts(), QuotaAmounts(gpus=1), InvalidInput, "scope"),
        ("team:acme/ml", QuotaAmounts(gpus=4), QuotaAmounts(gpus=2), InvalidInput, "guarantee.gpus: 4 is above"),
        ("team:acme/ml", QuotaAmounts(), QuotaAmounts(gpus=-1), InvalidInput, "limit.gpus: -1 is not an amount"),
    ],
)
async def test_a_refused_quota_changes_nothing_and_leaves_its_row_to_the_listener(
    parts: Parts,
    scope: str | None,
    guarantee: QuotaAmounts,
    limit: QuotaAmounts,
    refusal: type[Exception],
    message: str,
) -> None:
    await acme_ml(parts)
    audit = draft()
    with pytest.raises(refusal, match=message):
        await parts.service.put(scope, guarantee, limit, audit)
    assert not audit.committed
    assert parts.store.list_quotas() == [] and parts.table.all() == [] and parts.reconciler.kicks == 0
    assert parts.store.list_audit(limit=10) == []


async def test_a_quota_removed_by_path_or_of_a_scope_that_is_gone_and_one_that_is_not_there(parts: Parts) -> None:
    acme, ml = await acme_ml(parts)
    await parts.service.put(ml, QuotaAmounts(), QuotaAmounts(gpus=2), draft())
    assert await parts.service.remove("team:acme/ml", draft("DELETE /api/v1/quotas/{scope}")) == ml
    assert parts.store.get_quota(ml) is None and parts.table.get(ml) is None and parts.reconciler.kicks == 2
    assert [(r.action, r.target) for r in parts.store.list_audit(limit=10)][0] == ("DELETE /api/v1/quotas/{scope}", ml)

    web = await parts.tenancy.create("team", "web", "acme")
    gone = f"team:{web.id}"
    await parts.service.put(gone, QuotaAmounts(), QuotaAmounts(gpus=1), draft())
    await parts.tenancy.delete("team", web.id)  # the quota of a team that is gone can still be removed, by ID
    assert await parts.service.remove(gone, draft()) == gone
    assert parts.table.all() == [] and parts.store.list_quotas() == []

    audit = draft()
    with pytest.raises(NotFound, match="the scope has no quota; GET /api/v1/quotas lists those that do"):
        await parts.service.remove(acme, audit)
    with pytest.raises(NotFound, match="no team"):
        await parts.service.remove("team:acme/nope", audit)
    assert not audit.committed and parts.reconciler.kicks == 4


async def test_another_leaders_quotas_are_followed_into_the_table(parts: Parts, tmp_path: Path) -> None:
    _, ml = await acme_ml(parts)
    other = Store.open(None, home=tmp_path)
    try:
        other.put_quota(ml, "team", QuotaAmounts(), QuotaAmounts(gpus=3), by="elsewhere")
        assert await parts.service.follow() is True
        assert parts.table.get(ml) == Quota(ml, Bounds(), Bounds(gpus=3)) and parts.reconciler.kicks == 1
        assert await parts.service.follow() is False and parts.reconciler.kicks == 1
        other.remove_quota(ml)
        assert await parts.service.follow() is True
        assert parts.table.all() == [] and parts.reconciler.kicks == 2
    finally:
        other.close()


def test_the_table_at_start_is_the_stores(tmp_path: Path) -> None:
    with Store.open(None, home=tmp_path) as store:
        store.put_quota("org:o1", "org", QuotaAmounts(cpu_cores=8), QuotaAmounts(), by="ops")
        assert load_quotas(store).all() == QuotaTable([Quota("org:o1", Bounds(cpu_cores=8), Bounds())]).all()
