"""The batch runner: sends each client job's lines through the gateway, as live requests, and writes its files.

Every line is served by :meth:`opod.gateway.app.Gateway.serve_as` (the route's rules, admission,
routing, budgets, a usage row under the batch's key): there is no second serve path. A line is
marked answered in the store the moment its answer arrives, so a leader that stops or crashes
resumes a batch with the lines still pending and never sends an answered one again; each line's
``X-Request-Id`` is ``<batch>-<line>``, the same on every try, so its usage rows say which line
they were. A refusal that says "later" (503, or a 429 other than spent budget) leaves the line
pending and tries it again with back-off; any other answer is final (a 4xx or 5xx goes to the
batch's error file, as OpenAI's does).

One leader runs a job at a time: the holder of its lease, renewed at every look. The lease's
owner is this machine and home, so a leader restarted on the same home takes its jobs back at once.
While no job has work left the runner does not look: a batch created here wakes it, and one created
on another leader reaches it through :meth:`BatchRunner.follow`, asked only when the store changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from starlette.responses import Response

from opod.access.keytable import KeyEntry
from opod.store import NotFound, Store
from opod.store.client_jobs import JobLine, JobRecord
from opod.store.offloop import run_sync

log = logging.getLogger("opod.batches")

ServeAs = Callable[[KeyEntry | None, str, bytes, str, str], Awaitable[Response]]
"""``Gateway.serve_as``: (caller, path, body, request id, admission class) → the answer a client would get."""

BATCH_CLASS = "sheddable"
"""Lines run in the lowest admission class: live requests go first, and a line shed for them is tried again later."""

LEASE = timedelta(seconds=30)
LOOK_EVERY = 1.0
"""Seconds between looks for work while some job has work left, whoever holds it (a lease may lapse); a new
batch or a cancel also wakes the runner at once."""
CALLER_FRESH = 5.0
"""Seconds a batch's key is trusted as read; then read again, so a revoked key stops its batch."""
RETRY_FIRST, RETRY_MOST = 0.5, 4.0


def runner_owner(home: Path) -> str:
    """Who holds a job's lease: this machine and leader home (the same after a restart)."""
    return f"{socket.gethostname()}:{home.resolve()}"


def key_entry(store: Store, snapshot_keys: Callable[[], list[KeyEntry]], key_id: str) -> KeyEntry | None:
    """The key a batch was created with, as it is now (revoked, expired); ``None`` for an anonymous batch or a key gone."""
    if not key_id:
        return None
    try:
        record = store.get_key(key_id)
    except NotFound:
        return next((k for k in snapshot_keys() if k.id == key_id), None)
    values = {f.name: getattr(record, f.name) for f in fields(KeyEntry) if hasattr(record, f.name)}
    values["revoked"] = record.revoked_at is not None
    return KeyEntry(**values)


def _retry_later(status: int, body: object) -> bool:
    if status == 503:
        return True  # no capacity yet, or this leader is stopping
    if status == 429:
        error = body.get("error") if isinstance(body, dict) else None
        return not (isinstance(error, dict) and error.get("code") == "insufficient_quota")
    return False


async def _read(response: Response) -> bytes:
    body = getattr(response, "body", None)
    if isinstance(body, bytes | memoryview):
        return bytes(body)
    chunks = [chunk if isinstance(chunk, bytes) else str(chunk).encode() async for chunk in response.body_iterator]  # type: ignore[attr-defined]
    return b"".join(chunks)


def _request_id(job_id: str, line: int) -> str:
    return f"{job_id}-{line}"


def _line_id(job_id: str, line: int) -> str:
    return f"batch_req_{job_id.removeprefix('batch_')}_{line}"


class BatchRunner:
    def __init__(
        self,
        store: Store,
        serve_as: ServeAs,
        caller: Callable[[str], KeyEntry | None],
        owner: str,
        *,
        concurrency: int = 8,
    ) -> None:
        self.store = store
        self.serve_as = serve_as
        self.caller = caller
        """Reads a batch's key by id (blocking: called off the loop)."""
        self.owner = owner
        self.slots = asyncio.Semaphore(concurrency)
        """Lines in flight, all jobs together."""
        self.concurrency = concurrency
        self._wake = asyncio.Event()
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._left = True
        """Whether some job had work left at the last look; true at first, so a restart takes its jobs back."""

    def wake(self) -> None:
        """Look for work now: a batch was created or asked to cancel."""
        self._wake.set()

    async def follow(self) -> bool:
        """Whether some job has work left (the leader's :class:`~opod.store.following.Following` asks when the
        store changed); the runner is woken when it was not looking, e.g. for a batch created on another leader.
        While it looks by itself (work was left at its last look) the store is not asked again here."""
        if self._left:
            return True
        left = await run_sync(self.store.client_jobs_left)
        if left:
            self.wake()
        return left

    async def run(self, stop: asyncio.Event) -> None:
        """Claim the jobs with work left and run each until it ends or ``stop`` is set; lines in flight then finish."""
        try:
            while not stop.is_set():
                if self._left or self._wake.is_set():
                    self._wake.clear()  # before the look: a wake during it makes another
                    await self._claim(stop)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(self._wake.wait(), stop.wait()), LOOK_EVERY if self._left else None)
            await asyncio.gather(*self._jobs.values(), return_exceptions=True)
        finally:
            for task in self._jobs.values():
                task.cancel()
            await asyncio.gather(*self._jobs.values(), return_exceptions=True)

    async def _claim(self, stop: asyncio.Event) -> None:
        """Take the jobs whose lease is free or ours and start those not running here; note whether any is left."""
        try:
            jobs = await run_sync(self.store.claim_client_jobs, self.owner, lease=LEASE)
            self._left = bool(jobs) or await run_sync(self.store.client_jobs_left)
        except Exception:  # the store may be back at the next look
            log.exception("looking for batches to run failed")
            self._left = True
            return
        for job in jobs:
            if job.id not in self._jobs or self._jobs[job.id].done():
                self._jobs[job.id] = asyncio.create_task(self._run_job(job, stop), name=f"batch {job.id}")

    async def _run_job(self, job: JobRecord, stop: asyncio.Event) -> None:
        try:
            await self._drive(job, stop)
        except Exception:
            log.exception("batch %s stopped on an error; it resumes at the next look", job.id)

    async def _drive(self, job: JobRecord, stop: asyncio.Event) -> None:
        caller, caller_read = await run_sync(self.caller, job.owner_key_id), time.monotonic()
        in_flight: dict[int, asyncio.Task[bool]] = {}
        retry_at: dict[int, tuple[float, float]] = {}  # line → (when, the next delay)
        while True:
            current = await run_sync(self.store.get_client_job, job.id)
            if current is None or current.ended:
                return
            ending = (
                "cancelled"
                if current.status == "cancelling"
                else "expired"
                if datetime.now(UTC) >= current.expires_at
                else ""
            )
            if stop.is_set() or ending:
                await asyncio.gather(*in_flight.values(), return_exceptions=True)
                if ending:
                    await self._finish(current, ending)
                return
            if time.monotonic() - caller_read > CALLER_FRESH:
                caller, caller_read = await run_sync(self.caller, job.owner_key_id), time.monotonic()
            now = time.monotonic()
            room = self.concurrency - len(in_flight)
            if room > 0:
                pending = await run_sync(self.store.pending_lines, job.id, limit=room + len(in_flight) + len(retry_at))
                for line in pending:
                    if room <= 0:
                        break
                    if line.line in in_flight or retry_at.get(line.line, (0.0, 0.0))[0] > now:
                        continue
                    in_flight[line.line] = asyncio.create_task(self._send(current, caller, line))
                    room -= 1
                if not pending and not in_flight:
                    await self._finish(current, "completed")
                    return
            signals = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            waits: set[asyncio.Future[Any]] = {*in_flight.values(), *signals}
            done, _ = await asyncio.wait(
                waits, timeout=LOOK_EVERY if not in_flight else None, return_when=asyncio.FIRST_COMPLETED
            )
            for signal in signals:
                signal.cancel()
            for number, task in list(in_flight.items()):
                if not task.done():
                    continue
                del in_flight[number]
                settled = not task.cancelled() and task.exception() is None and task.result()
                if settled:
                    retry_at.pop(number, None)
                else:
                    delay = retry_at.get(number, (0.0, RETRY_FIRST))[1]
                    retry_at[number] = (time.monotonic() + delay, min(delay * 2, RETRY_MOST))
            if not done and retry_at:
                await asyncio.sleep(min(max(0.0, min(w for w, _ in retry_at.values()) - time.monotonic()), LOOK_EVERY))

    async def _send(self, job: JobRecord, caller: KeyEntry | None, line: JobLine) -> bool:
        """Serve one line and record its answer; False when it is to be tried again later (left pending)."""
        body = json.loads(line.request_json)
        if body.get("stream"):
            body["stream"] = False  # a batch's answers are whole objects
            body.pop("stream_options", None)
        request_id = _request_id(job.id, line.line)
        async with self.slots:
            try:
                response = await self.serve_as(caller, job.endpoint, json.dumps(body).encode(), request_id, BATCH_CLASS)
                status, data = response.status_code, await _read(response)
            except Exception as err:  # a failure of the leader, not of the request: the line says so
                log.exception("batch %s line %d failed in the leader", job.id, line.line)
                status, data = (
                    500,
                    json.dumps(
                        {
                            "error": {
                                "message": f"the leader failed serving this line: {err}",
                                "type": "server_error",
                                "code": "internal_error",
                            }
                        }
                    ).encode(),
                )
        try:
            answer: object = json.loads(data) if data else None
        except ValueError:
            answer = data.decode(errors="replace")
        if _retry_later(status, answer):
            return False
        usage = answer.get("usage") if isinstance(answer, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        record = json.dumps({"status_code": status, "request_id": request_id, "body": answer})
        # Shielded: once the answer is here it is written, even if the leader stops this task meanwhile.
        await asyncio.shield(
            run_sync(
                self.store.answer_line,
                job.id,
                line.line,
                ok=200 <= status < 300,
                response_json=record,
                prompt_tokens=prompt if isinstance(prompt, int) else 0,
                completion_tokens=completion if isinstance(completion, int) else 0,
            )
        )
        return True

    async def _finish(self, job: JobRecord, status: str) -> None:
        """Write the output and error files (OpenAI's JSONL) and end the job, in one transaction."""
        await run_sync(self.store.mark_finalizing, job.id)
        lines = await run_sync(self.store.job_lines, job.id)
        skipped_error = {"code": f"batch_{status}", "message": f"The batch was {status} before this request was sent."}
        output, errors = [], []
        for line in lines:
            item = {
                "id": _line_id(job.id, line.line),
                "custom_id": line.custom_id,
                "response": json.loads(line.response_json) if line.response_json else None,
                "error": json.loads(line.error_json) if line.error_json else None,
            }
            if line.state == "answered":
                output.append(item)
            elif line.state == "failed":
                errors.append(item)
            elif line.state == "pending":
                errors.append({**item, "error": skipped_error})
        await run_sync(
            self.store.finish_client_job,
            job.id,
            status,
            output=_jsonl(output),
            errors=_jsonl(errors),
            skipped_error_json=json.dumps(skipped_error),
        )
        log.info("batch %s %s: %d answered, %d failed", job.id, status, len(output), len(errors))


def _jsonl(items: list[dict[str, object]]) -> bytes | None:
    return "".join(json.dumps(item) + "\n" for item in items).encode() if items else None


async def _first(*waits: Awaitable[object]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
