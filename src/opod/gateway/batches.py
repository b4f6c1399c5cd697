"""OpenAI's Batch API on ``/v1/batches``: create from an uploaded JSONL file, list, one, cancel.

Creating a batch reads its input file once, checks every line (OpenAI's rules: a JSON object with
a unique ``custom_id``, ``method`` POST, the batch's ``url``, a ``body`` object) and keeps the lines
in the store; a file that breaks them makes a ``failed`` batch whose ``errors`` name each line,
as OpenAI's does. The leader's runner (``opod.leader.batches``) sends the lines through the same
path as a live request and writes the output and error files. Objects are OpenAI's ``Batch`` as
the ``openai`` package parses them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opod.access.keytable import KeyEntry
from opod.contract import durations
from opod.gateway.files import Authenticate, ClientFiles, NotFoundHere, caller_of, limit_arg, page
from opod.http.errors import BadRequest, shown
from opod.http.inbound import json_object, json_value
from opod.store import Store
from opod.store.client_jobs import JobLine, JobRecord
from opod.store.offloop import run_sync

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The routes a batch's lines may name (its ``endpoint``)."""

WINDOW = re.compile(r"([1-9]\d*)(h|m|s)")
LONGEST_WINDOW = timedelta(hours=24)
ERRORS_LISTED = 100
"""Line errors named in a failed batch's ``errors``; the first ones, as OpenAI lists them."""


def completion_window(text: object) -> timedelta:
    """``24h`` (OpenAI's one window) or a shorter duration such as ``1h`` or ``90s``."""
    try:
        seconds = durations.seconds(text) if isinstance(text, str) and WINDOW.fullmatch(text) else None
    except ValueError:
        seconds = None
    if seconds is None:
        raise BadRequest(f"completion_window: {shown(text)} is not a window; send 24h", param="completion_window")
    window = timedelta(seconds=seconds)
    if window > LONGEST_WINDOW:
        raise BadRequest(
            f"completion_window: {shown(text)} is longer than 24h, the longest window", param="completion_window"
        )
    return window


def metadata_arg(value: object) -> dict[str, str]:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return {}
    if (
        not isinstance(value, dict)
        or len(value) > 16
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()
        )
    ):
        raise BadRequest(
            "metadata: at most 16 pairs of strings (keys up to 64 characters, values up to 512)", param="metadata"
        )
    return value


def parse_lines(content: bytes, endpoint: str) -> tuple[list[JobLine], str, list[dict[str, Any]]]:
    """The input file's lines, the model the first names, and OpenAI's ``BatchError`` for each broken line."""
    lines: list[JobLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model = ""

    def fail(number: int, code: str, message: str, param: str | None = None) -> None:
        errors.append({"code": code, "line": number, "message": message, **({"param": param} if param else {})})

    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return (
            [],
            "",
            [{"code": "invalid_json_line", "line": 1, "message": "The file is not UTF-8 text; a batch is JSONL."}],
        )
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json_value(raw, f"Line {number}")
        except BadRequest as refusal:
            fail(number, "invalid_json_line", f"{refusal.message} Each line is one request object.", refusal.param)
            continue
        if not isinstance(item, dict):
            fail(number, "invalid_json_line", f"Line {number} is not a JSON object.")
            continue
        custom_id, method, url, body = item.get("custom_id"), item.get("method"), item.get("url"), item.get("body")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            fail(
                number,
                "missing_required_parameter",
                f"Line {number}: custom_id must be a non-empty string.",
                "custom_id",
            )
        elif custom_id in seen:
            fail(
                number,
                "duplicate_custom_id",
                f"Line {number}: custom_id {shown(custom_id)} is used by an earlier line; each must be unique.",
                "custom_id",
            )
        elif method != "POST":
            fail(number, "invalid_method", f"Line {number}: method must be POST, not {shown(method)}.", "method")
        elif url != endpoint:
            fail(
                number,
                "mismatched_endpoint",
                f"Line {number}: url {shown(url)} is not the batch's endpoint {endpoint}.",
                "url",
            )
        elif not isinstance(body, dict):
            fail(number, "invalid_request", f"Line {number}: body must be the request, a JSON object.", "body")
        else:
            seen.add(custom_id)
            if not model and isinstance(body.get("model"), str):
                model = body["model"]
            lines.append(JobLine(number, custom_id, json.dumps(body)))
    if not lines and not errors:
        errors.append({"code": "empty_file", "line": None, "message": "The input file has no request lines."})
    return lines, model, errors


def _stamp(value: Any) -> int | None:
    return None if value is None else int(value.timestamp())


def batch_object(job: JobRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint,
        "input_file_id": job.input_file_id,
        "completion_window": job.completion_window,
        "status": job.status,
        "created_at": _stamp(job.created_at),
        "expires_at": _stamp(job.expires_at),
        "metadata": json.loads(job.metadata_json) or None,
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "usage": {
            "input_tokens": job.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": job.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": job.prompt_tokens + job.completion_tokens,
        },
    }
    if job.model:
        out["model"] = job.model
    for name in (
        "in_progress_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
    ):
        if (value := getattr(job, name)) is not None:
            out[name] = _stamp(value)
    if job.output_file_id:
        out["output_file_id"] = job.output_file_id
    if job.error_file_id:
        out["error_file_id"] = job.error_file_id
    if job.errors_json:
        out["errors"] = {"object": "list", "data": json.loads(job.errors_json)}
    return out


class ClientBatches:
    """The ``/v1/batches`` routes; ``wake`` tells the runner there is work (a new batch, a cancel)."""

    def __init__(self, store: Store, authenticate: Authenticate, wake: Callable[[], None], files: ClientFiles) -> None:
        self.store = store
        self.authenticate = authenticate
        self.wake = wake
        self.files = files

    def routes(self) -> list[Route]:
        return [
            Route("/v1/batches", self.create, methods=["POST"]),
            Route("/v1/batches", self.listing, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.one, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]

    async def _job(self, key: KeyEntry | None, batch_id: str) -> JobRecord:
        key_id, project_id = caller_of(key)
        job = await run_sync(self.store.get_client_job, batch_id, key_id=key_id, project_id=project_id)
        if job is None:
            raise NotFoundHere(f"No batch with id {shown(batch_id)} (GET /v1/batches lists yours).", param="batch_id")
        return job

    async def create(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            body = json_object(await request.body())
            endpoint = body.get("endpoint")
            if endpoint not in ENDPOINTS:
                raise BadRequest(
                    f"endpoint: {shown(endpoint)} is not one a batch runs; send one of {', '.join(ENDPOINTS)}",
                    param="endpoint",
                )
            window_text = body.get("completion_window", "24h")
            window = completion_window(window_text)
            metadata = metadata_arg(body.get("metadata"))
            input_file_id = body.get("input_file_id")
            if not isinstance(input_file_id, str) or not input_file_id:
                raise BadRequest(
                    "input_file_id: name the uploaded file (POST /v1/files with purpose=batch)", param="input_file_id"
                )
            record = await self.files.visible(key, input_file_id)
            if record.purpose != "batch":
                raise BadRequest(
                    f"input_file_id: the file {shown(input_file_id)} was uploaded for {shown(record.purpose)}, not batch",
                    param="input_file_id",
                )
            content = await run_sync(self.store.file_content, record.id) or b""
            lines, model, errors = parse_lines(content, endpoint)
            key_id, project_id = caller_of(key)
            job = await run_sync(
                self.store.create_client_job,
                owner_key_id=key_id,
                project_id=project_id,
                endpoint=endpoint,
                model=model,
                input_file_id=record.id,
                completion_window=window,
                window_text=str(window_text),
                metadata_json=json.dumps(metadata),
                lines=lines,
                errors_json=json.dumps(errors[:ERRORS_LISTED]) if errors else None,
            )
            if not job.ended:
                self.wake()
            return batch_object(job)

        return await self.files.answer(request, work)

    async def listing(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            limit = limit_arg(request.query_params.get("limit"), 20, 100)
            key_id, project_id = caller_of(key)
            jobs = await run_sync(self.store.list_client_jobs, key_id=key_id, project_id=project_id, limit=10_000)
            return page([batch_object(j) for j in jobs], request.query_params.get("after"), limit)

        return await self.files.answer(request, work)

    async def one(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            return batch_object(await self._job(key, request.path_params["batch_id"]))

        return await self.files.answer(request, work)

    async def cancel(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            job = await self._job(key, request.path_params["batch_id"])
            job = await run_sync(self.store.cancel_client_job, job.id)
            self.wake()
            return batch_object(job)

        return await self.files.answer(request, work)
