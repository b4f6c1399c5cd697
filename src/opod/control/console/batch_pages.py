"""The console's batch jobs: every client's ``/v1/batches``, listed and filtered, a batch's page streamed while it
runs, and cancelling one.

A batch is read from the store as ``/api/v1/client-jobs`` reads it (the runner keeps its counts
there as each line is answered), so a page shows the same batch on any leader. The list is filtered
(state, project, text) and cut to one page by the store; a batch's counts stream to its page until it ends. A cancel is
the management API's (:func:`opod.control.client_job_rules.cancel`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from opod.control.client_job_rules import cancel
from opod.control.console.auth import OPERATE, Viewer
from opod.control.console.kit import PREFIX, Console, Done, Refused, link, page_size, whole
from opod.control.console.live import stream_block
from opod.control.context import JobWaker
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.client_jobs import JOB_STATES, JobRecord
from opod.store.files import LIST_MAX
from opod.store.offloop import run_sync


def _errors(job: JobRecord) -> list[str]:
    """A refused input file's reasons, one line each (``line 3: …``)."""
    try:
        found = json.loads(job.errors_json or "[]")
    except ValueError:
        return [job.errors_json or ""]
    items = found if isinstance(found, list) else [found]
    return [
        f"line {e['line']}: {e.get('message', '')}"
        if isinstance(e, dict) and e.get("line") is not None
        else (str(e.get("message", e)) if isinstance(e, dict) else str(e))
        for e in items
    ]


def _live(job: JobRecord) -> dict[str, Any]:
    done = job.completed + job.failed
    return {"job": job, "done": done, "pending": max(0, job.total - done), "errors": _errors(job)}


class BatchPages:
    """Every client's batches, read from the store."""

    def __init__(self, console: Console, *, store: Store, batches: JobWaker) -> None:
        self.console = console
        self.store = store
        self.batches = batches

    def routes(self) -> list[BaseRoute]:
        c = self.console
        return [
            Route(f"{PREFIX}/batches", c.page(self.batches_page), methods=["GET"]),
            Route(f"{PREFIX}/batches/{{id}}", c.page(self.batch_page), methods=["GET"]),
            Route(f"{PREFIX}/batches/{{id}}/live", c.page(self.batch_stream), methods=["GET"]),
            Route(
                f"{PREFIX}/batches/{{id}}/cancel",
                c.action(OPERATE, "POST /api/v1/client-jobs/{id}/cancel", self.cancel),
                methods=["POST"],
            ),
        ]

    async def batches_page(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        needle = q.get("q", "").strip().lower()
        project = q.get("project", "").strip()
        state = q.get("state", "").strip().lower()
        if state and state not in JOB_STATES:
            raise Refused(400, f"state: {state!r} is not one of {', '.join(JOB_STATES)}")
        size = page_size(request)
        number = whole(q.get("page"), "page", low=1, high=LIST_MAX, default=1) or 1

        def page(number: int) -> tuple[list[JobRecord], int]:
            offset = (number - 1) * size
            return self.store.page_client_jobs(
                status=state or None, project_id=project, contains=needle, offset=offset, limit=size
            )

        rows, total = await run_sync(page, number)
        pages = max(1, -(-total // size))
        if number > pages:
            raise Refused(400, f"page: {number} is outside 1..{pages}")
        values = {
            "title": "Batches",
            "rows": rows,
            "total": total,
            "page": number,
            "pages": pages,
            "states": JOB_STATES,
            "earlier": link(request, page=number - 1) if number > 1 else "",
            "later": link(request, page=number + 1) if number < pages else "",
        }
        return self.console.render(request, viewer, "batches.html", values)

    async def _one(self, batch_id: str) -> JobRecord:
        job = await run_sync(self.store.get_client_job, batch_id)
        if job is None:
            raise Refused(404, f"id: no batch {batch_id!r}; {PREFIX}/batches lists them")
        return job

    async def batch_page(self, request: Request, viewer: Viewer) -> Response:
        job = await self._one(request.path_params["id"])
        return self.console.render(request, viewer, "batch.html", {"title": f"Batch {job.id}", **_live(job)})

    async def batch_stream(self, request: Request, viewer: Viewer) -> Response:
        """The batch's state and counts as they change, until it ends."""
        batch_id = request.path_params["id"]
        await self._one(batch_id)  # a batch never kept is a 404 page, not an empty stream

        async def look() -> tuple[Mapping[str, Any], bool]:
            job = await self._one(batch_id)
            return _live(job), job.ended

        return stream_block(request, self.console.templates, "batch.html", "live", look, name="batch")

    async def cancel(self, request: Request, viewer: Viewer, fields: dict[str, str], draft: AuditDraft) -> Done:
        """Cancel the batch as ``POST /api/v1/client-jobs/{id}/cancel`` does: its lines in flight finish."""
        batch_id = request.path_params["id"]
        job = await cancel(self.store, self.batches, await self._one(batch_id), batch_id)
        return Done(f"{job.id} is {job.status}; the lines in flight finish, no other is sent", refresh="")
