"""The console's pages of what happened: usage (a chart drawn on the server, totals by scope, CSV) and the audit log.

Usage is read as ``/api/v1/usage`` and ``/api/v1/usage/export`` read it (the store's totals, one
chunk of time at a time); the audit as ``/api/v1/audit`` does, newest first, one page at a time
(``before`` the last row's id), filtered by actor, source and text on the server.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from opod.access.scopes import Scope
from opod.access.tenancy import Tenancy
from opod.control.console.auth import Viewer
from opod.control.console.charts import Chart, bar_chart
from opod.control.console.kit import PREFIX, Console, Refused, link, page_size, whole
from opod.control.usage_export import csv_lines, totals
from opod.store import Store
from opod.store.audit import SOURCE_API, SOURCE_LEADER, SOURCE_WEB
from opod.store.offloop import run_sync
from opod.store.usage_report import ExportTotals, dimensions

LEVELS = ("org", "team", "project")
METRICS = {"requests": "Requests", "cost": "Spend (USD)", "tokens": "Tokens"}
SOURCES = (SOURCE_API, SOURCE_WEB, SOURCE_LEADER)
DAYS_MAX = 366


def day_range(request: Request) -> tuple[int, datetime, datetime]:
    """The days a usage page shows (``days``, 14 when absent): how many, from the first one's midnight (UTC) to now."""
    days = whole(request.query_params.get("days"), "days", low=1, high=DAYS_MAX, default=14) or 14
    end = datetime.now(UTC)
    start = (end - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return days, start, end


def metric_of(request: Request) -> str:
    """What a usage page's chart shows (``metric``, one of :data:`METRICS`; requests when absent)."""
    metric = request.query_params.get("metric", "requests").strip().lower()
    if metric not in METRICS:
        raise Refused(400, f"metric: {metric!r} is not one of {', '.join(METRICS)}")
    return metric


def each_day(start: datetime, days: int) -> dict[str, list[int]]:
    """``YYYY-MM-DD`` → [requests, cost in micros, tokens], zero for each day from ``start``, for :func:`daily_chart`."""
    return {(start + timedelta(days=i)).date().isoformat(): [0, 0, 0] for i in range(days)}


def add_day(per_day: dict[str, list[int]], row: ExportTotals) -> None:
    day = per_day.setdefault(row.period.date().isoformat(), [0, 0, 0])
    day[0] += row.requests
    day[1] += row.cost_micros
    day[2] += row.prompt + row.completion


def daily_chart(per_day: dict[str, list[int]], metric: str) -> Chart:
    pick = {"requests": 0, "cost": 1, "tokens": 2}[metric]
    scale = 1_000_000 if metric == "cost" else 1
    points = [(day[5:], values[pick] / scale) for day, values in sorted(per_day.items())]
    return bar_chart(points, shown="{:,.2f}" if metric == "cost" else "{:,.0f}")


class RecordPages:
    def __init__(self, console: Console, *, store: Store, tenancy: Tenancy) -> None:
        self.console = console
        self.store = store
        self.tenancy = tenancy

    def routes(self) -> list[BaseRoute]:
        return [
            Route(f"{PREFIX}/usage", self.console.page(self.usage_page), methods=["GET"]),
            Route(f"{PREFIX}/usage.csv", self.console.page(self.usage_csv), methods=["GET"]),
            Route(f"{PREFIX}/audit", self.console.page(self.audit_page), methods=["GET"]),
        ]

    # --- usage -------------------------------------------------------------------------------

    async def usage_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        days, start, end = day_range(request)
        metric = metric_of(request)
        level = q.get("by", "team").strip().lower()
        if level not in LEVELS:
            raise Refused(400, f"by: {level!r} is not one of org, team, project")
        per_day = each_day(start, days)
        async for found in totals(self.store, "day", [], start, end):
            for row in found:
                add_day(per_day, row)
        chart = daily_chart(per_day, metric)
        scopes = await run_sync(self.store.usage_by_scope, level, start)
        rows = [
            {
                "scope": Scope(level, t.id).text,  # type: ignore[arg-type]
                "name": self.tenancy.name(Scope(level, t.id)),  # type: ignore[arg-type]
                "requests": t.requests,
                "tokens": t.prompt_tokens + t.completion_tokens,
                "errors": t.errors,
                "cost": t.cost_micros,
            }
            for t in sorted(scopes, key=lambda t: -t.cost_micros)[:100]
        ]
        values = {
            "title": "Usage",
            "chart": chart,
            "metric": metric,
            "metric_name": METRICS[metric],
            "metrics": METRICS,
            "days": days,
            "by": level,
            "levels": LEVELS,
            "rows": rows,
            "csv": f"{PREFIX}/usage.csv?days={days}",
        }
        return self.console.render(request, viewer, "usage.html", values)

    async def usage_csv(self, request: Request, viewer: Viewer) -> Response:
        """The export of ``/api/v1/usage/export`` (by day, by the dimensions ``by`` names) for the page's range."""
        days, start, end = day_range(request)
        dims = dimensions(request.query_params.get("by") or None)
        name = f"usage-{start:%Y%m%d}-{end:%Y%m%d}-day.csv"
        return StreamingResponse(
            csv_lines(self.store, "day", dims, start, end),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    # --- audit -------------------------------------------------------------------------------

    async def audit_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        source = q.get("source", "").strip().lower()
        if source and source not in SOURCES:
            raise Refused(400, f"source: {source!r} is not one of {', '.join(SOURCES)}")
        before = whole(q.get("before"), "before", low=1, high=2**62)
        size = page_size(request)
        found = await run_sync(
            lambda: self.store.list_audit(
                limit=size + 1,
                actor=q.get("actor", "").strip() or None,
                contains=q.get("q", "").strip() or None,
                source=source or None,
                before=before,
            )
        )
        rows = found[:size]
        values = {
            "title": "Audit",
            "rows": rows,
            "sources": SOURCES,
            "later": link(request, before=rows[-1].id) if len(found) > size else "",
            "first": link(request, before=None) if before else "",
        }
        return self.console.render(request, viewer, "audit.html", values)
