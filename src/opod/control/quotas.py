"""``/api/v1/quotas``: capacity quotas per organization, team or project, and what each scope holds now.

A quota is a guarantee and a limit in GPUs, CPU cores and GB of memory; ``PUT``
replaces it whole, and an amount left out is not governed. The scope may be
named by path (``team:acme/ml``) or by ID; answers name it by ID (``team:ID``).
Each change is written to the store with its audit row, then to the leader's
:class:`~opod.fleet.quotas.QuotaTable`, and the reconciler is woken: the next
round places by the new quota (:mod:`opod.fleet.quotas` says how it counts).
Quotas put on another leader of the same store reach this leader's table through
:class:`QuotaFollower`, which reads the (small) table whole every 2 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from fastapi import APIRouter, Depends

from opod.access.scopes import TENANCY_KINDS, Scope
from opod.access.tenancy import TenancyScopes
from opod.contract.admin.common import Removed
from opod.contract.admin.tenancy import QuotaAmount, QuotaRequest, QuotaSet, QuotaView, StoreResources
from opod.control.audit import AuditDraft, audit_draft
from opod.control.context import ControlContext
from opod.control.spec import SpecRouter
from opod.fleet.quotas import Amount, Bounds, Quota, QuotaTable
from opod.store import NotFound, QuotaAmounts, QuotaRecord, Store
from opod.store.following import follow_store
from opod.store.offloop import run_sync


def quota_of(record: QuotaRecord) -> Quota:
    """The quota as placement counts it."""
    g, lim = record.guarantee, record.limit
    return Quota(record.scope, Bounds(g.gpus, g.cpu_cores, g.memory_gb), Bounds(lim.gpus, lim.cpu_cores, lim.memory_gb))


def load_quotas(store: Store) -> QuotaTable:
    """The leader's quota table, from the store (at start-up, off the loop)."""
    return QuotaTable(quota_of(r) for r in store.list_quotas())


class QuotaFollower:
    """Brings into the leader's :class:`QuotaTable` the quotas other leaders of the same store put or removed."""

    def __init__(self, store: Store, table: QuotaTable, changed: Callable[[], None]) -> None:
        """``changed`` is called after the table took another leader's change (the reconciler is woken)."""
        self.store = store
        self.table = table
        self.changed = changed

    async def run(self, stop: asyncio.Event) -> None:
        await follow_store(stop, self.follow, "quotas")

    async def follow(self) -> bool:
        """Read every quota and apply what differs; True when the table changed."""
        before = _by_scope(self.table)
        wanted = {q.scope: q for q in map(quota_of, await run_sync(self.store.list_quotas))}
        now = _by_scope(self.table)
        if now != before or now == wanted:
            return False  # a change made here meanwhile may be newer than this read: the next round reads it
        for scope in now.keys() - wanted.keys():
            self.table.remove(scope)
        for scope, quota in wanted.items():
            if now.get(scope) != quota:
                self.table.put(quota)
        self.changed()
        return True


def _by_scope(table: QuotaTable) -> dict[str, Quota]:
    return {q.scope: q for q in table.all()}


def _amounts(body: StoreResources | None) -> QuotaAmounts:
    return QuotaAmounts() if body is None else QuotaAmounts(body.gpus, body.cpu_cores, body.memory_gb)


def _resources(amounts: QuotaAmounts) -> StoreResources | None:
    return (
        StoreResources(gpus=amounts.gpus, cpu_cores=amounts.cpu_cores, memory_gb=amounts.memory_gb)
        if amounts.governed()
        else None
    )


def _held(amount: Amount) -> QuotaAmount:
    return QuotaAmount(GPUs=round(amount.gpus), CPUCores=round(amount.cpu_cores), MemoryGB=round(amount.memory_gb))


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    def resolve(text: str | None) -> Scope:
        """The scope a body or path names, by ID."""
        return ctx.tenancy.resolve(text or "", kinds=TENANCY_KINDS, field="scope")

    def name(scope: str) -> str:
        return TenancyScopes(ctx.tenancy).label(scope)

    def views(records: Iterable[QuotaRecord]) -> list[QuotaView]:
        holds = ctx.reconciler.quota_holds()
        return [
            QuotaView(
                scope=r.scope,
                name=name(r.scope) or None,
                guarantee=_resources(r.guarantee),
                limit=_resources(r.limit),
                holds=_held(holds.get(r.scope, Amount())),
                updated_by=r.updated_by or None,
                updated_at=r.updated_at,
            )
            for r in records
        ]

    def changed(scope: str, record: QuotaRecord | None) -> None:
        if ctx.quotas is not None:
            if record is None:
                ctx.quotas.remove(scope)
            else:
                ctx.quotas.put(quota_of(record))
        ctx.reconciler.kick()

    @api.get("/api/v1/quotas", operation_id="getQuotas", tags=["quotas"], response_model=list[QuotaView])
    async def get_quotas() -> list[QuotaView]:
        return views(await run_sync(ctx.store.list_quotas))

    @api.put("/api/v1/quotas", operation_id="putQuotas", tags=["quotas"], response_model=QuotaSet)
    async def put_quotas(body: QuotaRequest, draft: AuditDraft = Depends(audit_draft)) -> QuotaSet:
        scope = resolve(body.scope)
        guarantee, limit = _amounts(body.guarantee), _amounts(body.limit)
        detail = {"scope": body.scope, **body.model_dump(exclude_none=True, include={"guarantee", "limit"})}
        with draft.commit(target=scope.text, detail=detail) as row:
            record = await run_sync(
                ctx.store.put_quota,
                scope.text,
                scope.kind,
                guarantee,
                limit,
                by=draft.actor,
                audit=row,
            )
        changed(scope.text, record)
        return QuotaSet(scope=scope.text)

    # ``:path``: a scope named by path (``team:acme/ml``) holds slashes; the document still reads ``{scope}``.
    @api.delete(
        "/api/v1/quotas/{scope:path}", operation_id="deleteQuotasScope", tags=["quotas"], response_model=Removed
    )
    async def delete_quotas_scope(scope: str, draft: AuditDraft = Depends(audit_draft)) -> Removed:
        try:
            key = resolve(scope).text
        except NotFound:
            if await run_sync(ctx.store.get_quota, scope) is None:
                raise
            key = scope  # the quota of a scope that is gone, named by ID: it can still be removed
        with draft.commit(target=key) as row:
            await run_sync(ctx.store.remove_quota, key, audit=row)
        changed(key, None)
        return Removed(removed=key)

    return api
