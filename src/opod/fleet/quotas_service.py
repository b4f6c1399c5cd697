"""The one writer of capacity quotas: put and removed here, followed from other leaders of the same store.

A quota is a guarantee and a limit in GPUs, CPU cores and GB of memory on an organization, a
team or a project; ``put`` replaces it whole, and an amount left out is not governed. The scope
may be named by path (``team:acme/ml``) or by ID (the tenancy tree resolves it,
:class:`~opod.fleet.scopes.ScopeTree`); it is kept as ``team:ID``. Each change is written to
the store with its audit row, then to the leader's :class:`~opod.fleet.quotas.QuotaTable`, and
the reconciler is woken: its next round places by the new quota (:mod:`opod.fleet.quotas` says
how it counts). Quotas put or removed on another leader of the same store reach this leader's
table through :meth:`QuotasService.follow`, which reads the (small) table whole every 2 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from opod.fleet.followers import Reconciling
from opod.fleet.quotas import Amount, Bounds, Quota, QuotaTable
from opod.fleet.scopes import ScopeTree
from opod.store import QuotaAmounts, QuotaRecord, Store
from opod.store.audit import AuditDraft
from opod.store.errors import NotFound
from opod.store.following import StaleRead
from opod.store.offloop import run_sync
from opod.store.schema import QUOTA_KINDS


class QuotaCounting(Reconciling, Protocol):
    """The reconciler (``opod.leader.reconciler.Reconciler``) as the quotas see it: woken after a change, and asked
    what each scope's models hold."""

    def quota_holds(self) -> Mapping[str, Amount]:
        """What each scope's models hold now, as the last round counted it."""
        ...


@dataclass(frozen=True, slots=True)
class QuotaStanding:
    """A quota as the operator reads it: as stored, the scope's name, and what its models hold now."""

    record: QuotaRecord
    name: str
    """How people know the scope (``Acme / ml``); ``""`` for a scope that is gone."""
    holds: Amount


def quota_of(record: QuotaRecord) -> Quota:
    """The quota as placement counts it."""
    g, lim = record.guarantee, record.limit
    return Quota(record.scope, Bounds(g.gpus, g.cpu_cores, g.memory_gb), Bounds(lim.gpus, lim.cpu_cores, lim.memory_gb))


def load_quotas(store: Store) -> QuotaTable:
    """The leader's quota table, from the store (at start-up, off the loop)."""
    return QuotaTable(quota_of(r) for r in store.list_quotas())


def _governed(amounts: QuotaAmounts) -> dict[str, int]:
    return {k: v for k, v in asdict(amounts).items() if v is not None}


class QuotasService:
    """Changes quotas: the store with its audit row, then the table placement reads, then the reconciler."""

    def __init__(self, store: Store, table: QuotaTable, *, scopes: ScopeTree, reconciler: QuotaCounting) -> None:
        """``table`` is the one the reconciler places by (:func:`load_quotas`)."""
        self.store = store
        self.table = table
        self.scopes = scopes
        self.reconciler = reconciler

    async def standings(self) -> list[QuotaStanding]:
        """Every quota, by scope, with what each scope holds now."""
        holds = self.reconciler.quota_holds()
        return [
            QuotaStanding(r, self.scopes.label(r.scope), holds.get(r.scope, Amount()))
            for r in await run_sync(self.store.list_quotas)
        ]

    async def put(
        self, scope: str | None, guarantee: QuotaAmounts, limit: QuotaAmounts, audit: AuditDraft
    ) -> QuotaRecord:
        """Replace the quota of the scope ``scope`` names whole (``NotFound`` for no such scope, ``InvalidInput`` for
        a kind that takes no quota, an amount that is not one, a guarantee above its limit)."""
        key = self.scopes.scope(scope or "", kinds=QUOTA_KINDS, field="scope")
        detail: dict[str, Any] = {"scope": scope}
        for which, amounts in (("guarantee", guarantee), ("limit", limit)):
            if amounts.governed():
                detail[which] = _governed(amounts)
        with audit.commit(target=key, detail=detail) as row:
            record = await run_sync(
                self.store.put_quota, key, key.split(":", 1)[0], guarantee, limit, by=audit.actor, audit=row
            )
        self.table.put(quota_of(record))
        self.reconciler.kick()
        return record

    async def remove(self, scope: str, audit: AuditDraft) -> str:
        """Remove the quota of the scope ``scope`` names (``NotFound`` when it has none); answers the scope as
        ``kind:ID``. A scope that is gone is named by ID, as its quota is kept."""
        try:
            key = self.scopes.scope(scope, kinds=QUOTA_KINDS, field="scope")
        except NotFound:
            if await run_sync(self.store.get_quota, scope) is None:
                raise
            key = scope
        with audit.commit(target=key) as row:
            await run_sync(self.store.remove_quota, key, audit=row)
        self.table.remove(key)
        self.reconciler.kick()
        return key

    # --- other leaders' changes --------------------------------------------------------------

    async def follow(self) -> bool:
        """Read every quota and apply what differs; True when the table changed (the reconciler is woken). The
        leader's :class:`~opod.store.following.Following` calls it when the store changed.

        Raises :class:`~opod.store.following.StaleRead` when a change made here overlapped the read, which may
        be older than it: the read is dropped and made again at the next look."""
        before = _by_scope(self.table)
        wanted = {q.scope: q for q in map(quota_of, await run_sync(self.store.list_quotas))}
        now = _by_scope(self.table)
        if now != before:
            raise StaleRead("a quota changed here during the read")
        if now == wanted:
            return False
        for scope in now.keys() - wanted.keys():
            self.table.remove(scope)
        for scope, quota in wanted.items():
            if now.get(scope) != quota:
                self.table.put(quota)
        self.reconciler.kick()
        return True


def _by_scope(table: QuotaTable) -> dict[str, Quota]:
    return {q.scope: q for q in table.all()}
