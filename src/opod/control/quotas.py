"""``/api/v1/quotas``: capacity quotas per organization, team or project, and what each scope holds now.

Thin handlers over :class:`~opod.fleet.quotas_service.QuotasService`, the one writer of quotas. A
scope may be named by path (``team:acme/ml``) or by ID; answers name it by ID (``team:ID``).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.common import Removed
from opod.contract.admin.tenancy import QuotaAmount, QuotaRequest, QuotaSet, QuotaView, StoreResources
from opod.control.audit import audit_draft
from opod.control.spec import SpecRouter
from opod.fleet.quotas import Amount
from opod.fleet.quotas_service import QuotasService, QuotaStanding
from opod.store import QuotaAmounts
from opod.store.audit import AuditDraft


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


def _view(standing: QuotaStanding) -> QuotaView:
    r = standing.record
    return QuotaView(
        scope=r.scope,
        name=standing.name or None,
        guarantee=_resources(r.guarantee),
        limit=_resources(r.limit),
        holds=_held(standing.holds),
        updated_by=r.updated_by or None,
        updated_at=r.updated_at,
    )


def router(quotas: QuotasService) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/quotas", operation_id="getQuotas", tags=["quotas"], response_model=list[QuotaView])
    async def get_quotas() -> list[QuotaView]:
        return [_view(s) for s in await quotas.standings()]

    @api.put("/api/v1/quotas", operation_id="putQuotas", tags=["quotas"], response_model=QuotaSet)
    async def put_quotas(body: QuotaRequest, draft: AuditDraft = Depends(audit_draft)) -> QuotaSet:
        record = await quotas.put(body.scope, _amounts(body.guarantee), _amounts(body.limit), draft)
        return QuotaSet(scope=record.scope)

    # ``:path``: a scope named by path (``team:acme/ml``) holds slashes; the document still reads ``{scope}``.
    @api.delete(
        "/api/v1/quotas/{scope:path}", operation_id="deleteQuotasScope", tags=["quotas"], response_model=Removed
    )
    async def delete_quotas_scope(scope: str, draft: AuditDraft = Depends(audit_draft)) -> Removed:
        return Removed(removed=await quotas.remove(scope, draft))

    return api
