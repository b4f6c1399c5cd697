"""Serve jobs: a registry repository fetched, placed, started and tried (``POST /api/v1/models/serve``).

One row per job. The job as the management API shows it (``modelserve.Job``: its request, steps,
reply) is kept whole as JSON beside the columns a query needs: its state, when it started and which
leader runs it (``runner``: the machine and home, the same after a restart). A leader that starts
again finds the jobs it was running (:meth:`ServeJobsRepo.unfinished_serve_jobs`) and marks them failed with
the reason, so no job is left running with nobody running it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Index, Row, Table, Text, insert, select, update

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, json_arg, text_arg, when
from opod.store.errors import NotFound
from opod.store.schema import UTCDateTime, metadata

RUNNING = "running"
"""The one state a runner still has work in; every other state is an end."""

serve_jobs = Table(
    "serve_jobs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("runner", Text, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("job_json", Text, nullable=False),
    Index("ix_serve_jobs_started_at", "started_at"),
)


@dataclass(frozen=True, slots=True)
class ServeJobRecord:
    id: str
    state: str
    runner: str
    started_at: datetime
    updated_at: datetime
    job_json: str


def new_serve_job_id() -> str:
    return "sj_" + secrets.token_hex(8)


def _record(row: Row[Any]) -> ServeJobRecord:
    return ServeJobRecord(**row._mapping)


class ServeJobsRepo(Repository):
    def add_serve_job(
        self, job_id: str, job_json: str, *, runner: str, at: datetime | None = None, audit: AuditRow | None = None
    ) -> ServeJobRecord:
        """Keep a job that starts running now; ``audit`` commits with it."""
        started = when(at, "started_at")
        record = ServeJobRecord(
            id=text_arg(job_id, "job id"),
            state=RUNNING,
            runner=text_arg(runner, "runner"),
            started_at=started,
            updated_at=started,
            job_json=json_arg(job_json, f"job {job_id}"),
        )
        with self._write() as conn:
            conn.execute(insert(serve_jobs).values(**_values(record)))
            if audit is not None:
                insert_audit(conn, audit)
        return record

    def put_serve_job(self, job_id: str, state: str, job_json: str, *, at: datetime | None = None) -> None:
        """Replace a job's state and body as it moved on; ``NotFound`` for a job never kept."""
        values = {
            "state": text_arg(state, "state"),
            "job_json": json_arg(job_json, f"job {job_id}"),
            "updated_at": when(at, "updated_at"),
        }
        with self._write() as conn:
            done = conn.execute(update(serve_jobs).where(serve_jobs.c.id == job_id).values(**values))
            if done.rowcount == 0:
                raise NotFound(f"job {job_id!r} is not kept")

    def get_serve_job(self, job_id: str) -> ServeJobRecord | None:
        with self._read() as conn:
            row = conn.execute(select(serve_jobs).where(serve_jobs.c.id == job_id)).first()
        return _record(row) if row is not None else None

    def list_serve_jobs(self) -> list[ServeJobRecord]:
        """Every job, the newest first."""
        query = select(serve_jobs).order_by(serve_jobs.c.started_at.desc(), serve_jobs.c.id)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]

    def unfinished_serve_jobs(self, runner: str) -> list[ServeJobRecord]:
        """The jobs ``runner`` left running: a leader that starts again finds what it was doing when it stopped."""
        query = select(serve_jobs).where(serve_jobs.c.runner == runner, serve_jobs.c.state == RUNNING)
        with self._read() as conn:
            return [_record(row) for row in conn.execute(query)]


def _values(record: ServeJobRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "state": record.state,
        "runner": record.runner,
        "started_at": record.started_at,
        "updated_at": record.updated_at,
        "job_json": record.job_json,
    }
