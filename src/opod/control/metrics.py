"""``POST /api/v1/metrics/range``: several PromQL range queries at once, against the Prometheus the settings name.

Each query runs as ``/api/v1/query_range`` over the last ``window`` with one point per ``step``
(both integer nanoseconds), all at once and each within :data:`QUERY_TIMEOUT`. A query that
fails is named in ``errors`` with Prometheus's reason; the others still answer. Without
``prometheus.url`` in the settings the answer is ``configured: false``. A query's ``by`` names a
label: series with the same value of it are summed into one line named by that value; without
``by`` each series is a line named as PromQL writes it (``name{label="value"}``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
from fastapi import APIRouter

from opod.contract.admin.records import MetricsQuery, MetricsRequest, MetricsResult, PromqPoint, PromqSeries
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.settings.holder import SettingsHolder

QUERY_TIMEOUT = 10.0
"""Seconds one query may take, connection included."""
MAX_POINTS = 11_000
"""Points per series Prometheus answers at most (its own limit on window / step)."""
MAX_QUERIES = 50
NS = 1_000_000_000


def router(settings: SettingsHolder) -> APIRouter:
    api = SpecRouter()

    @api.post("/api/v1/metrics/range", operation_id="postMetricsRange", tags=["metrics"], response_model=MetricsResult)
    async def post_metrics_range(body: MetricsRequest) -> MetricsResult:
        queries = _checked(body)
        url = settings.current.prometheus.url
        if not url:
            return MetricsResult(configured=False, series={}, errors={})
        end = time.time()
        window, step = (body.window or 0) / NS, (body.step or 0) / NS
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=QUERY_TIMEOUT)) as session:
            answers = await asyncio.gather(*(_range(session, url, q, end - window, end, step) for q in queries))
        series: dict[str, list[PromqSeries]] = {}
        errors: dict[str, str] = {}
        for query, (lines, error) in zip(queries, answers, strict=True):
            if error:
                errors[query.id or ""] = error
            else:
                series[query.id or ""] = lines
        return MetricsResult(configured=True, series=series, errors=errors)

    return api


def _checked(body: MetricsRequest) -> list[MetricsQuery]:
    """The queries, or a 400 naming the first field that is wrong (nothing is asked of Prometheus then)."""
    if body.window is None or body.window <= 0:
        raise ControlError(400, "window: the span to chart, in nanoseconds, more than 0 (3600000000000 is an hour)")
    if body.step is None or body.step <= 0:
        raise ControlError(400, "step: the time between points, in nanoseconds, more than 0 (15000000000 is 15 s)")
    if body.step < NS // 1000:
        raise ControlError(400, "step: at least 1 ms (1000000 ns); Prometheus resolves no finer")
    if body.window / body.step > MAX_POINTS:
        raise ControlError(
            400,
            f"window / step: {body.window // body.step} points per series; Prometheus answers at most "
            f"{MAX_POINTS}: make step longer or window shorter",
        )
    queries = body.queries or []
    if not queries:
        raise ControlError(400, "queries: name at least one {id, expr}")
    if len(queries) > MAX_QUERIES:
        raise ControlError(400, f"queries: {len(queries)} given, at most {MAX_QUERIES} at once")
    seen: set[str] = set()
    for i, query in enumerate(queries):
        if not query.id:
            raise ControlError(400, f"queries[{i}].id: each query needs an id, which names its lines in the answer")
        if query.id in seen:
            raise ControlError(
                400, f"queries[{i}].id: {query.id!r} is used twice; ids name the answers, so each is unique"
            )
        seen.add(query.id)
        if not (query.expr or "").strip():
            raise ControlError(
                400, f"queries[{i}].expr: a PromQL expression is needed (such as rate(opod_requests_total[5m]))"
            )
    return list(queries)


async def _range(
    session: aiohttp.ClientSession, base: str, query: MetricsQuery, start: float, end: float, step: float
) -> tuple[list[PromqSeries], str]:
    """One query's lines, or ``([], why it failed)``."""
    params = {"query": query.expr or "", "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    where = base.rstrip("/") + "/api/v1/query_range"
    try:
        async with session.get(where, params=params) as answer:
            try:
                found = await answer.json(content_type=None)
            except ValueError:
                return [], f"Prometheus at {base} answered {answer.status} without JSON"
    except TimeoutError:
        return [], f"Prometheus at {base} did not answer within {QUERY_TIMEOUT:g} s"
    except aiohttp.ClientError as err:
        return [], f"cannot reach Prometheus at {base}: {err or type(err).__name__}"
    if not isinstance(found, dict) or found.get("status") != "success":
        why = found.get("error") if isinstance(found, dict) else None
        return [], f"Prometheus refused the query ({answer.status}): {why or 'no reason given'}"
    data = found.get("data") or {}
    if data.get("resultType") != "matrix":
        return [], f"Prometheus answered a {data.get('resultType')!r}, not a range of points"
    return lines(data.get("result") or [], query.by or ""), ""


def lines(result: Sequence[Mapping[str, Any]], by: str) -> list[PromqSeries]:
    """Prometheus's matrix as lines, oldest point first; grouped and summed by the label ``by`` when given.

    A sample that is not a number (NaN, ±Inf) is left out: JSON cannot carry it and a chart cannot draw it.
    """
    grouped: dict[str, dict[float, float]] = {}
    for series in result:
        metric = series.get("metric") or {}
        name = str(metric.get(by, "")) if by else _promql_name(metric)
        points = grouped.setdefault(name, {})
        for at, text in series.get("values") or []:
            value = float(text)
            if math.isfinite(value):
                points[float(at)] = points.get(float(at), 0.0) + value
    return [
        PromqSeries(
            Name=name,
            Points=[
                PromqPoint(At=datetime.fromtimestamp(at, UTC), Value=value) for at, value in sorted(points.items())
            ],
        )
        for name, points in sorted(grouped.items())
    ]


def _promql_name(metric: Mapping[str, str]) -> str:
    name = metric.get("__name__", "")
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{labels}}}" if labels else name or "{}"
