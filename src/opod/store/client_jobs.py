"""Client jobs: OpenAI's Batch API, kept so a restarted leader resumes a batch without sending a line twice.

Its input and output files are the store's files (:mod:`opod.store.files`).

A batch is one ``client_jobs`` row (its OpenAI id ``batch_…``; the management API's ``JobView``
names the same row ``job_…``) and one ``client_job_lines`` row per input line. A line is answered
once: :meth:`ClientJobsRepo.answer_line` updates a ``pending`` line and the job's counters in one
transaction, and does nothing to a line answered already. A job is run by one leader at a time,
the holder of its lease (``lease_owner``, ``lease_until``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Index,
    Integer,
    Row,
    Table,
    Text,
    UniqueConstraint,
    and_,
    func,
    insert,
    or_,
    select,
    true,
    update,
)

from opod.store.base import Repository, contains_pattern, json_arg, text_arg, when
from opod.store.errors import InvalidInput, NotFound
from opod.store.files import FileRecord, insert_file, limit_arg, new_file_id, visible
from opod.store.schema import UTCDateTime, metadata

JOB_STATES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
"""OpenAI's batch states, in its words."""
ACTIVE_STATES = ("validating", "in_progress", "finalizing", "cancelling")
"""States a runner still has work in: it holds a lease on these."""
ENDED_STATES = ("failed", "completed", "expired", "cancelled")
LINE_STATES = ("pending", "answered", "failed", "skipped")
"""``answered``: a 2xx response; ``failed``: a non-2xx response or an error; ``skipped``: never sent (cancelled, expired)."""

client_jobs = Table(
    "client_jobs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("owner_key_id", Text, nullable=False),
    Column("project_id", Text, nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("input_file_id", Text, nullable=False),
    Column("completion_window", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("metadata_json", Text, nullable=False),
    Column("errors_json", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("in_progress_at", UTCDateTime, nullable=True),
    Column("finalizing_at", UTCDateTime, nullable=True),
    Column("completed_at", UTCDateTime, nullable=True),
    Column("failed_at", UTCDateTime, nullable=True),
    Column("expired_at", UTCDateTime, nullable=True),
    Column("cancelling_at", UTCDateTime, nullable=True),
    Column("cancelled_at", UTCDateTime, nullable=True),
    Column("output_file_id", Text, nullable=True),
    Column("error_file_id", Text, nullable=True),
    Column("total", BigInteger, nullable=False),
    Column("completed", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("lease_owner", Text, nullable=False),
    Column("lease_until", UTCDateTime, nullable=True),
    Index("ix_client_jobs_status", "status"),
)

client_job_lines = Table(
    "client_job_lines",
    metadata,
    Column("job_id", Text, ForeignKey("client_jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("custom_id", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("request_json", Text, nullable=False),
    Column("response_json", Text, nullable=True),
    Column("error_json", Text, nullable=True),
    Column("answered_at", UTCDateTime, nullable=True),
    UniqueConstraint("job_id", "custom_id"),
)


def new_job_id() -> str:
    return "batch_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class JobLine:
    """One input line of a batch, as the runner sends it."""

    line: int
    custom_id: str
    request_json: str
    """The line's ``body``: the request, as JSON text."""


@dataclass(frozen=True, slots=True)
class LineRecord:
    line: int
    custom_id: str
    state: str
    response_json: str | None
    error_json: str | None


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    owner_key_id: str
    project_id: str
    endpoint: str
    model: str
    input_file_id: str
    completion_window: str
    status: str
    metadata_json: str
    errors_json: str | None
    created_at: datetime
    expires_at: datetime
    in_progress_at: datetime | None
    finalizing_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    expired_at: datetime | None
    cancelling_at: datetime | None
    cancelled_at: datetime | None
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    lease_owner: str
    lease_until: datetime | None

    @property
    def ended(self) -> bool:
        return self.status in ENDED_STATES


def _job(row: Row[Any]) -> JobRecord:
    return JobRecord(**dict(row._mapping))


class ClientJobsRepo(Repository):
    def create_client_job(
        self,
        *,
        owner_key_id: str,
        project_id: str,
        endpoint: str,
        model: str,
        input_file_id: str,
        completion_window: timedelta,
        window_text: str,
        metadata_json: str,
        lines: Sequence[JobLine],
        errors_json: str | None = None,
        created_at: datetime | None = None,
        id: str | None = None,
        leased_to: tuple[str, timedelta] | None = None,
    ) -> JobRecord:
        """A new job with its lines, in one transaction: ``in_progress``, or ``failed`` when ``errors_json`` says why.

        ``leased_to`` (a runner, a lease) has the job held from its first moment, so no other runner's look can
        take it between its creation and a claim."""
        at = when(created_at, "created_at")
        failed = errors_json is not None
        custom_ids = [line.custom_id for line in lines]
        if len(set(custom_ids)) != len(custom_ids):
            raise InvalidInput("custom_id must be unique within a batch")
        values: dict[str, Any] = dict(
            id=text_arg(id, "job id") if id is not None else new_job_id(),
            owner_key_id=text_arg(owner_key_id, "owner key", empty=True),
            project_id=text_arg(project_id, "project", empty=True),
            endpoint=text_arg(endpoint, "endpoint"),
            model=text_arg(model, "model", empty=True),
            input_file_id=text_arg(input_file_id, "input_file_id"),
            completion_window=text_arg(window_text, "completion_window"),
            status="failed" if failed else "in_progress",
            metadata_json=json_arg(metadata_json, "metadata"),
            errors_json=json_arg(errors_json, "errors") if errors_json is not None else None,
            created_at=at,
            expires_at=at + completion_window,
            in_progress_at=None if failed else at,
            finalizing_at=None,
            completed_at=None,
            failed_at=at if failed else None,
            expired_at=None,
            cancelling_at=None,
            cancelled_at=None,
            output_file_id=None,
            error_file_id=None,
            total=0 if failed else len(lines),
            completed=0,
            failed=0,
            prompt_tokens=0,
            completion_tokens=0,
            lease_owner=text_arg(leased_to[0], "runner") if leased_to else "",
            lease_until=at + leased_to[1] if leased_to else None,
        )
        with self._write() as conn:
            conn.execute(insert(client_jobs).values(**values))
            if not failed and lines:
                conn.execute(
                    insert(client_job_lines),
                    [
                        {
                            "job_id": values["id"],
                            "line": line.line,
                            "custom_id": text_arg(line.custom_id, "custom_id"),
                            "state": "pending",
                            "request_json": json_arg(line.request_json, "body"),
                            "response_json": None,
                            "error_json": None,
                            "answered_at": None,
                        }
                        for line in lines
                    ],
                )
        return JobRecord(**values)

    def get_client_job(self, id: str, *, key_id: str | None = None, project_id: str = "") -> JobRecord | None:
        with self._read() as conn:
            row = conn.execute(
                select(client_jobs).where(client_jobs.c.id == id, visible(client_jobs, key_id, project_id))
            ).first()
        return None if row is None else _job(row)

    def list_client_jobs(
        self,
        *,
        key_id: str | None = None,
        project_id: str = "",
        status: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> list[JobRecord]:
        """Newest first; ``after`` a job id: only those created before it (OpenAI's cursor)."""
        query = select(client_jobs).where(visible(client_jobs, key_id, project_id))
        if status:
            query = query.where(client_jobs.c.status == status)
        with self._read() as conn:
            if after:
                cursor = conn.execute(select(client_jobs.c.created_at).where(client_jobs.c.id == after)).scalar()
                if cursor is None:
                    raise NotFound(f"after: no batch {after!r}; pass the last id of the previous page")
                query = query.where(
                    or_(
                        client_jobs.c.created_at < cursor,
                        and_(client_jobs.c.created_at == cursor, client_jobs.c.id < after),
                    )
                )
            query = query.order_by(client_jobs.c.created_at.desc(), client_jobs.c.id.desc()).limit(limit_arg(limit))
            return [_job(row) for row in conn.execute(query)]

    def page_client_jobs(
        self, *, status: str | None = None, project_id: str = "", contains: str = "", offset: int = 0, limit: int = 50
    ) -> tuple[list[JobRecord], int]:
        """One page of every client's jobs, newest first, and how many match in all: of ``project_id`` when given,
        in ``status`` when given, whose id, model or endpoint contains ``contains`` (any case) when given."""
        if offset < 0:
            raise InvalidInput(f"offset {offset} is below 0")
        wanted: list[Any] = []
        if project_id:
            wanted.append(client_jobs.c.project_id == project_id)
        if status:
            wanted.append(client_jobs.c.status == status)
        if contains:
            pattern = contains_pattern(contains.lower())
            texts = (client_jobs.c.id, client_jobs.c.model, client_jobs.c.endpoint)
            wanted.append(or_(*(func.lower(c).like(pattern, escape="\\") for c in texts)))
        matching = and_(true(), *wanted)
        page = (
            select(client_jobs)
            .where(matching)
            .order_by(client_jobs.c.created_at.desc(), client_jobs.c.id.desc())
            .offset(offset)
            .limit(limit_arg(limit))
        )
        with self._read() as conn:
            total = conn.execute(select(func.count()).select_from(client_jobs).where(matching)).scalar_one()
            return [_job(row) for row in conn.execute(page)], int(total)

    def cancel_client_job(self, id: str, at: datetime | None = None) -> JobRecord:
        """Ask a job to stop: ``cancelling`` until its runner has let the lines in flight finish. An ended job is left as it is."""
        stamp = when(at, "cancelling_at")
        with self._write() as conn:
            conn.execute(
                update(client_jobs)
                .where(client_jobs.c.id == id, client_jobs.c.status.in_(("validating", "in_progress")))
                .values(status="cancelling", cancelling_at=stamp)
            )
            row = conn.execute(select(client_jobs).where(client_jobs.c.id == id)).first()
        if row is None:
            raise NotFound(f"no batch {id!r}")
        return _job(row)

    def client_jobs_left(self) -> bool:
        """Whether any job has work left, whoever holds its lease: one look at the status index, nothing written."""
        with self._read() as conn:
            found = conn.execute(
                select(client_jobs.c.id).where(client_jobs.c.status.in_(ACTIVE_STATES)).limit(1)
            ).first()
        return found is not None

    def claim_client_jobs(self, owner: str, *, lease: timedelta, at: datetime | None = None) -> list[JobRecord]:
        """Take (or keep) the lease of every job with work left whose lease is free, lapsed or ``owner``'s own."""
        stamp = when(at, "at")
        free = or_(
            client_jobs.c.lease_owner == owner, client_jobs.c.lease_until.is_(None), client_jobs.c.lease_until < stamp
        )
        with self._write() as conn:
            conn.execute(
                update(client_jobs)
                .where(client_jobs.c.status.in_(ACTIVE_STATES), free)
                .values(lease_owner=owner, lease_until=stamp + lease)
            )
            rows = conn.execute(
                select(client_jobs)
                .where(client_jobs.c.status.in_(ACTIVE_STATES), client_jobs.c.lease_owner == owner)
                .order_by(client_jobs.c.created_at, client_jobs.c.id)
            ).all()
        return [_job(row) for row in rows]

    def pending_lines(self, job_id: str, *, after: int = -1, limit: int = 256) -> list[JobLine]:
        """Lines not answered yet, in order, after line number ``after``."""
        query = (
            select(client_job_lines.c.line, client_job_lines.c.custom_id, client_job_lines.c.request_json)
            .where(
                client_job_lines.c.job_id == job_id,
                client_job_lines.c.state == "pending",
                client_job_lines.c.line > after,
            )
            .order_by(client_job_lines.c.line)
            .limit(limit_arg(limit))
        )
        with self._read() as conn:
            return [JobLine(row.line, row.custom_id, row.request_json) for row in conn.execute(query)]

    def answer_line(
        self,
        job_id: str,
        line: int,
        *,
        ok: bool,
        response_json: str | None,
        error_json: str | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        at: datetime | None = None,
    ) -> bool:
        """Record a line's answer and count it, once: False (and nothing changed) when it was answered already."""
        stamp = when(at, "answered_at")
        with self._write() as conn:
            changed = conn.execute(
                update(client_job_lines)
                .where(
                    client_job_lines.c.job_id == job_id,
                    client_job_lines.c.line == line,
                    client_job_lines.c.state == "pending",
                )
                .values(
                    state="answered" if ok else "failed",
                    response_json=response_json,
                    error_json=error_json,
                    answered_at=stamp,
                )
            ).rowcount
            if not changed:
                return False
            counter = client_jobs.c.completed if ok else client_jobs.c.failed
            conn.execute(
                update(client_jobs)
                .where(client_jobs.c.id == job_id)
                .values(
                    {
                        counter.name: counter + 1,
                        "prompt_tokens": client_jobs.c.prompt_tokens + prompt_tokens,
                        "completion_tokens": client_jobs.c.completion_tokens + completion_tokens,
                    }
                )
            )
        return True

    def job_lines(self, job_id: str) -> list[LineRecord]:
        query = (
            select(
                client_job_lines.c.line,
                client_job_lines.c.custom_id,
                client_job_lines.c.state,
                client_job_lines.c.response_json,
                client_job_lines.c.error_json,
            )
            .where(client_job_lines.c.job_id == job_id)
            .order_by(client_job_lines.c.line)
        )
        with self._read() as conn:
            return [
                LineRecord(row.line, row.custom_id, row.state, row.response_json, row.error_json)
                for row in conn.execute(query)
            ]

    def count_pending_lines(self, job_id: str) -> int:
        with self._read() as conn:
            return int(
                conn.execute(
                    select(func.count())
                    .select_from(client_job_lines)
                    .where(client_job_lines.c.job_id == job_id, client_job_lines.c.state == "pending")
                ).scalar()
                or 0
            )

    def finish_client_job(
        self,
        job_id: str,
        status: str,
        *,
        output: bytes | None,
        errors: bytes | None,
        skipped_error_json: str | None = None,
        at: datetime | None = None,
    ) -> JobRecord:
        """End a job: its output and error files, the lines never sent marked ``skipped``, its state and time, in one transaction."""
        if status not in ENDED_STATES:
            raise InvalidInput(f"a job ends {', '.join(ENDED_STATES)}, not {status!r}")
        stamp = when(at, "at")
        with self._write() as conn:
            row = conn.execute(select(client_jobs).where(client_jobs.c.id == job_id)).first()
            if row is None:
                raise NotFound(f"no batch {job_id!r}")
            job = _job(row)
            if job.ended:
                return job
            file_ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
            for column, content, filename in (
                ("output_file_id", output, "output"),
                ("error_file_id", errors, "errors"),
            ):
                if content:
                    file_ids[column] = file_id = new_file_id()
                    output_file = FileRecord(
                        id=file_id,
                        owner_key_id=job.owner_key_id,
                        project_id=job.project_id,
                        purpose="batch_output",
                        filename=f"{job.id}_{filename}.jsonl",
                        bytes=len(content),
                        created_at=stamp,
                    )
                    insert_file(conn, output_file, content)  # counted in its project's files, never refused
            skipped = conn.execute(
                update(client_job_lines)
                .where(client_job_lines.c.job_id == job_id, client_job_lines.c.state == "pending")
                .values(state="skipped", error_json=skipped_error_json, answered_at=stamp)
            ).rowcount
            values: dict[str, Any] = {**file_ids, "status": status, f"{status}_at": stamp, "lease_until": None}
            if status == "expired" and skipped:
                values["failed"] = (
                    client_jobs.c.failed + skipped
                )  # OpenAI counts a line the window ran out on as failed
            conn.execute(update(client_jobs).where(client_jobs.c.id == job_id).values(values))
            return _job(conn.execute(select(client_jobs).where(client_jobs.c.id == job_id)).one())

    def mark_finalizing(self, job_id: str, at: datetime | None = None) -> None:
        stamp = when(at, "finalizing_at")
        with self._write() as conn:
            conn.execute(
                update(client_jobs)
                .where(client_jobs.c.id == job_id, client_jobs.c.status == "in_progress")
                .values(status="finalizing", finalizing_at=stamp)
            )
