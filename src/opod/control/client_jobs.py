"""``/api/v1/client-jobs``: every client's batches (OpenAI's Batch API on ``/v1``), as the spec's ``JobView``.

A batch ``batch_X`` is the job ``job_X``: one row, two names; either is taken in a path. ``progress``
is OpenAI's request counts (``total``, ``completed``, ``failed``) with ``pending``. The spec's
states map from OpenAI's: validating → queued, in_progress and finalizing → running, and the rest
by the same word. Cancelling stops sending the job's lines; those in flight finish.
"""

from __future__ import annotations

from fastapi import APIRouter

from opod.contract.admin.records import JobView
from opod.control.client_job_rules import SPEC_STATES, cancel
from opod.control.context import ControlError, JobWaker
from opod.control.spec import SpecRouter
from opod.store import Store
from opod.store.client_jobs import JobRecord
from opod.store.offloop import run_sync

FILTERS = ("queued", "running", "cancelling", "completed", "failed", "cancelled", "expired")
LIMIT_MOST = 1000


def job_id(batch_id: str) -> str:
    return "job_" + batch_id.removeprefix("batch_")


def batch_id(text: str) -> str:
    return "batch_" + text.removeprefix("job_") if text.startswith("job_") else text


def _time(value: object) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")  # type: ignore[attr-defined]


def view(job: JobRecord) -> JobView:
    finished = job.completed_at or job.failed_at or job.cancelled_at or job.expired_at
    error = None
    if job.status == "failed":
        error = "the input file has lines OpenAI's rules refuse (GET /v1/batches/{id} lists them)"
    elif job.status == "expired":
        error = f"the completion window {job.completion_window} ended before every line was answered"
    return JobView(
        id=job_id(job.id),
        owner=job.project_id or job.owner_key_id or None,
        key_id=job.owner_key_id or None,
        endpoint=job.endpoint,
        model=job.model or None,
        status=SPEC_STATES.get(job.status, job.status),
        progress={
            "total": job.total,
            "completed": job.completed,
            "failed": job.failed,
            "pending": max(0, job.total - job.completed - job.failed),
        },
        output_file_id=job.output_file_id,
        content_type="application/jsonl",
        error=error,
        created_at=job.created_at,
        started_at=_time(job.in_progress_at),
        finished_at=_time(finished),
    )


def router(store: Store, batches: JobWaker) -> APIRouter:
    api = SpecRouter()

    async def one(id: str) -> JobRecord:
        job = await run_sync(store.get_client_job, batch_id(id))
        if job is None:
            raise ControlError(404, f"id: no client job {id!r}; GET /api/v1/client-jobs lists them")
        return job

    @api.get("/api/v1/client-jobs", operation_id="getClientJobs", tags=["client-jobs"], response_model=list[JobView])
    async def get_client_jobs(status: str | None = None, limit: int | None = None) -> list[JobView]:
        if status and status not in FILTERS:
            raise ControlError(400, f"status: {status!r} is not a job state; use one of {', '.join(FILTERS)}")
        if limit is not None and not 1 <= limit <= LIMIT_MOST:
            raise ControlError(400, f"limit: {limit} is out of range; give 1 to {LIMIT_MOST} (50 when left out)")
        wanted = limit or 50
        states = [s for s, spec in SPEC_STATES.items() if spec == status] if status else [None]
        jobs: list[JobRecord] = []
        for state in states:
            jobs += await run_sync(store.list_client_jobs, status=state, limit=wanted)
        jobs.sort(key=lambda j: (j.created_at, j.id), reverse=True)
        return [view(j) for j in jobs[:wanted]]

    @api.get("/api/v1/client-jobs/{id}", operation_id="getClientJobsId", tags=["client-jobs"], response_model=JobView)
    async def get_client_jobs_id(id: str) -> JobView:
        return view(await one(id))

    @api.post(
        "/api/v1/client-jobs/{id}/cancel",
        operation_id="postClientJobsIdCancel",
        tags=["client-jobs"],
        response_model=JobView,
    )
    async def post_client_jobs_id_cancel(id: str) -> JobView:
        return view(await cancel(store, batches, await one(id), id))

    return api
