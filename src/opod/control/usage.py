"""``/api/v1/usage`` (what each org, team or project spent) and ``/api/v1/usage/export`` (totals by period).

Both read the usage rows the ledger keeps (one per ``/v1`` request, durable and crash-safe), each
attributed at request time to its key, person, project, team and org. A budget is shown only on
the level that sets it (:meth:`opod.gateway.budgets.Budgets.budget_of`, the budgets the gateway
enforces): a team bounded only by its org's budget shows none, since the org's figure against
each team would read as though each had that much. ``fraction`` is the spend of the
budget's current period over the budget.

The export is streamed: the store is read one chunk of time at a time (see
:mod:`opod.store.usage_report`) and each chunk's rows are written out before the next is read,
so a year of rows is never held in memory. CSV (the default) has a header line naming
``Period``, the dimensions asked for and the counts; JSON is a list of ``store.ExportRow``, with
the dimensions not asked for empty. Org, team and project are their IDs, user and key theirs too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse

from opod.access.keys import parse_lifetime
from opod.access.scopes import Scope
from opod.access.tenancy import Tenancy
from opod.contract.admin.records import ScopeUsageView, StoreExportRow
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.control.usage_export import FIELD, csv_lines, parse_time, stamp, totals
from opod.gateway.budgets import Budgets, period_bounds
from opod.store import Store
from opod.store.offloop import run_sync
from opod.store.usage_report import DIMENSIONS, PERIODS, ExportTotals, dimensions

LEVELS = ("org", "team", "project")


def export_row(row: ExportTotals) -> StoreExportRow:
    dims = {FIELD[name]: value for name, value in row.dims.items()}
    fields = {FIELD[name]: "" for name in DIMENSIONS} | dims
    return StoreExportRow(
        Period=row.period,
        **fields,
        Requests=row.requests,
        Errors=row.errors,
        Limited=row.limited,
        Prompt=row.prompt,
        Completion=row.completion,
        CostMicros=row.cost_micros,
        Images=0,
        Meshes=0,
    )


def router(store: Store, budgets: Budgets, tenancy: Tenancy) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/usage", operation_id="getUsage", tags=["usage"], response_model=list[ScopeUsageView])
    async def get_usage(by: str | None = None, since: str | None = None) -> list[ScopeUsageView]:
        level = (by or "team").strip().lower()
        if level not in LEVELS:
            raise ControlError(
                400, f"by: {by!r} is not a level of the tenancy tree; use org, team or project (team when absent)"
            )
        window = parse_lifetime(since or "24h", "since")
        if window is None:
            raise ControlError(400, "since: give a duration back from now, like 24h or 7d")
        now = datetime.now(UTC)
        totals = await run_sync(store.usage_by_scope, level, now - window)
        out = []
        for t in totals:
            scope = Scope(level, t.id)  # type: ignore[arg-type]
            view = ScopeUsageView(
                scope=scope.text,
                id=t.id,
                name=tenancy.name(scope),
                keys=t.keys,
                requests=t.requests,
                prompt_tokens=t.prompt_tokens,
                completion_tokens=t.completion_tokens,
                cost_micros=t.cost_micros,
                errors=t.errors,
                last_at=t.last_at,
            )
            budget = budgets.budget_of(scope.kind, scope.id)
            if budget is not None:
                micros, period = budget
                spent = await run_sync(store.usage_spent_since, level, t.id, period_bounds(period, now)[0])
                view.budget_micros, view.budget_period = micros, period
                view.fraction = spent / micros if micros else (1.0 if spent else 0.0)
            out.append(view)
        return out

    @api.get(
        "/api/v1/usage/export",
        operation_id="getUsageExport",
        tags=["usage"],
        response_model=list[StoreExportRow],
        responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}}},
    )
    async def get_usage_export(
        from_: str | None = Query(None, alias="from"),
        to: str | None = None,
        period: str | None = None,
        by: str | None = None,
        format: str | None = None,
    ) -> Response:
        now = datetime.now(UTC)
        start = parse_time(from_, "from") if from_ else now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = parse_time(to, "to", end=True) if to else now
        if end <= start:
            raise ControlError(
                400, f"to: {stamp(end)} is not after from ({stamp(start)}); give a range that moves forward"
            )
        step = (period or "day").strip().lower()
        if step not in PERIODS:
            raise ControlError(400, f"period: {period!r} is not one of hour, day, month (day when absent)")
        dims = dimensions(by)  # InvalidInput (400) naming a wrong one
        as_json = (format or "").strip().lower() == "json"

        async def as_json_list() -> AsyncIterator[str]:
            yield "["
            first = True
            async for found in totals(store, step, dims, start, end):
                text = ",".join(json.dumps(export_row(r).model_dump(mode="json"), separators=(",", ":")) for r in found)
                yield text if first else "," + text
                first = False
            yield "]"

        if as_json:
            return StreamingResponse(as_json_list(), media_type="application/json")
        name = f"usage-{start:%Y%m%d}-{end:%Y%m%d}-{step}.csv"
        return StreamingResponse(
            csv_lines(store, step, dims, start, end),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    return api
