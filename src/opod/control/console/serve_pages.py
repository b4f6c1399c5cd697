"""The console's serve jobs: the list, a job's page with its steps streamed while it runs, a repository's plan, and
serving one.

Everything is read and started through the serving service ``/api/v1/plan``, ``/models/serve`` and
``/jobs`` call (:class:`~opod.control.context.Serving`): a job's page shows what ``GET /jobs/{id}``
answers, the fetch's bytes in its step's detail, the smoke test's reply and tokens a second, the
error of a failed one. The list is filtered and cut to one page here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.contract.admin.models import ModelserveJob, ModelserveRequest
from opod.control.console.auth import OPERATE, Viewer
from opod.control.console.kit import PREFIX, Console, Done, Refused, link, page_size, whole
from opod.control.console.live import stream_block
from opod.control.context import Serving
from opod.store.audit import AuditDraft
from opod.store.serve_jobs import RUNNING

JOB_STATES = ("running", "succeeded", "failed")
FORMATS = ("gguf", "safetensors")
MOST_CONTEXT = 10_000_000
TEXT_FIELDS = ("repo", "quant", "file", "name", "gpu_class", "description", "class")
WHOLE_FIELDS = {"replicas": (0, 10_000), "context_length": (1, MOST_CONTEXT), "gpus_per_node": (1, 64)}
TICKED = ("cpu", "tools", "embeddings")
_PERCENT = re.compile(r"\((\d{1,3})%\)")


def _ticked(value: str | None) -> bool | None:
    """A checkbox's field: ticked (``on``, ``true``) or left out."""
    return True if (value or "").strip().lower() in ("on", "true", "1", "yes") else None


def serve_request(fields: Mapping[str, str]) -> ModelserveRequest:
    """The ``modelserve.Request`` a page's form asks for: empty fields left out, numbers checked naming the field."""
    body: dict[str, Any] = {k: fields[k].strip() for k in TEXT_FIELDS if fields.get(k, "").strip()}
    for key, (low, high) in WHOLE_FIELDS.items():
        value = whole(fields.get(key), key, low=low, high=high)
        if value is not None:
            body[key] = value
    for key in TICKED:
        if _ticked(fields.get(key)):
            body[key] = True
    fmt = fields.get("format", "").strip()
    if fmt:
        if fmt not in FORMATS:
            raise Refused(400, f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
        body["format"] = fmt
    if not body.get("repo"):
        raise Refused(400, "repo: required; the registry repository as owner/name, such as acme/tiny-GGUF")
    try:
        return ModelserveRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        raise Refused(400, f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


def _matches(job: ModelserveJob, needle: str) -> bool:
    if not needle:
        return True
    repo = job.request.repo if job.request is not None else ""
    return any(needle in (text or "").lower() for text in (job.id, job.model, repo))


def fetch_detail(job: ModelserveJob) -> str:
    """The fetch step's detail (its bytes done, of the total, and the rate) while it runs."""
    step = next((s for s in job.steps or [] if s.name == "fetch"), None)
    return (step.detail or "") if step is not None and step.state == "running" else ""


def fetched_percent(detail: str) -> int | None:
    """The share of the bytes fetched that a running fetch's detail says (``… (42%) …``), for its bar."""
    found = _PERCENT.search(detail)
    return min(100, int(found.group(1))) if found else None


def _live(job: ModelserveJob) -> dict[str, Any]:
    detail = fetch_detail(job)
    return {"job": job, "fetching": detail, "fetched": fetched_percent(detail)}


class ServePages:
    """Serve jobs, plans and serving over the serving service."""

    def __init__(self, console: Console, *, serving: Serving) -> None:
        self.console = console
        self.serving = serving

    def routes(self) -> list[BaseRoute]:
        c = self.console
        return [
            Route(f"{PREFIX}/jobs", c.page(self.jobs_page), methods=["GET"]),
            Route(
                f"{PREFIX}/jobs",
                c.action(OPERATE, "POST /api/v1/models/serve", self.serve),
                methods=["POST"],
            ),
            Route(f"{PREFIX}/jobs/{{id}}", c.page(self.job_page), methods=["GET"]),
            Route(f"{PREFIX}/jobs/{{id}}/live", c.page(self.job_stream), methods=["GET"]),
            Route(f"{PREFIX}/plan", c.page(self.plan_page), methods=["GET"]),
        ]

    # --- the list ----------------------------------------------------------------------------

    async def jobs_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        needle = q.get("q", "").strip().lower()
        state = q.get("state", "").strip().lower()
        if state and state not in JOB_STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(JOB_STATES)}")
        every = await self.serving.jobs()
        chosen = [j for j in every if _matches(j, needle) and (not state or j.state == state)]
        size = page_size(request)
        pages = max(1, -(-len(chosen) // size))
        number = whole(q.get("page"), "page", low=1, high=pages, default=1) or 1
        values = {
            "title": "Jobs",
            "rows": chosen[(number - 1) * size : number * size],
            "total": len(chosen),
            "all": len(every),
            "page": number,
            "pages": pages,
            "states": JOB_STATES,
            "formats": FORMATS,
            "earlier": link(request, page=number - 1) if number > 1 else "",
            "later": link(request, page=number + 1) if number < pages else "",
        }
        return self.console.render(request, viewer, "jobs.html", values)

    # --- one job -----------------------------------------------------------------------------

    async def job_page(self, request: Request, viewer: Viewer) -> Response:
        job = await self.serving.job(request.path_params["id"])
        values = {"title": f"Job {job.id}", **_live(job)}
        return self.console.render(request, viewer, "job.html", values)

    async def job_stream(self, request: Request, viewer: Viewer) -> Response:
        """The job's steps, reply and error as they change, until it ends."""
        job_id = request.path_params["id"]
        await self.serving.job(job_id)  # a job never kept is a 404 page, not an empty stream

        async def look() -> tuple[Mapping[str, Any], bool]:
            job = await self.serving.job(job_id)
            return _live(job), job.state != RUNNING

        return stream_block(request, self.console.templates, "job.html", "live", look, name="job")

    # --- plans and serving -------------------------------------------------------------------

    async def plan_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        repo = q.get("repo", "").strip()
        fmt = q.get("format", "").strip() or None
        context = whole(q.get("context"), "context", low=1, high=MOST_CONTEXT)
        plan = await self.serving.plan(repo, fmt, context) if repo else None
        values = {"title": f"Plan of {repo}" if repo else "Plan", "plan": plan, "formats": FORMATS}
        return self.console.render(request, viewer, "plan.html", values)

    async def serve(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        asked = serve_request(fields)
        draft.body = asked.model_dump(mode="json", exclude_none=True, by_alias=True)
        draft.status = 202  # as the API answers it: started, followed on its page
        job = await self.serving.start(asked, draft)
        return Done(
            f"job {job.id} serves {asked.repo} as {job.model}",
            refresh="",
            data={"job": job.id, "location": f"{PREFIX}/jobs/{job.id}"},
        )
