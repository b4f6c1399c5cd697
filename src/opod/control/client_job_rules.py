"""The client jobs' states in the management API's words, and cancelling one: what ``/api/v1/client-jobs`` and the
console's batch pages share.
"""

from __future__ import annotations

from opod.control.context import ControlError, JobWaker
from opod.store import Store
from opod.store.client_jobs import JobRecord
from opod.store.offloop import run_sync

SPEC_STATES = {
    "validating": "queued",
    "in_progress": "running",
    "finalizing": "running",
    "cancelling": "cancelling",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
    "expired": "expired",
}
"""OpenAI's batch state → the spec's job state."""


async def cancel(store: Store, batches: JobWaker, job: JobRecord, asked: str) -> JobRecord:
    """Stop sending ``job``'s lines (those in flight finish); 409 for one that has ended (``asked``: its id as given)."""
    if job.ended:
        raise ControlError(
            409,
            f"id: the client job {asked!r} has ended ({SPEC_STATES[job.status]}); only a queued or running one is cancelled",
        )
    job = await run_sync(store.cancel_client_job, job.id)
    batches.wake()
    return job
