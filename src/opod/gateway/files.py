"""OpenAI's Files API on ``/v1/files``, for batches: upload, list, one, its content, delete.

The objects are OpenAI's ``FileObject`` as the ``openai`` package parses them. A key sees the
files it uploaded and those of its project (the batch outputs of its project's keys included);
another key's file answers 404, as one that does not exist. Contents are kept in the store
(:mod:`opod.store.files` says why).

An upload is never held whole in memory: the body is parsed as it arrives into a spooled temporary
file (a megabyte in memory, the rest on disk, unlinked and 0600), counted as it comes so a body past
:data:`FILE_MAX_BYTES` stops at once, then copied into the store a chunk at a time; a download is
read from the store a chunk at a time. A project's files are bounded by ``files.project_bytes``
in the cluster's settings: an upload past it is a 413 naming it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from opod.access.keytable import KeyEntry
from opod.http.errors import BadRequest, BodyTooLarge, GatewayError, error_response
from opod.http.fastpath import headers_of
from opod.http.inbound import sane_request_id
from opod.store import Store
from opod.store.files import FILE_MAX_BYTES, FileRecord, OverQuota
from opod.store.offloop import run_sync

PURPOSES = ("batch",)
"""What an upload may be for here: the Batch API's input."""

Authenticate = Callable[[dict[bytes, bytes]], KeyEntry | None]

FORM_SLACK = 1 << 16
"""Bytes of a multipart body beyond its file: the boundaries, the part headers, the purpose field."""
QUOTA_SETTING = "files.project_bytes"


class NotFoundHere(GatewayError):
    """A file or batch this key cannot see: OpenAI's 404."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class FilesQuotaExceeded(GatewayError):
    """An upload that would take its project's files past ``files.project_bytes``."""

    status = 413
    type = "invalid_request_error"
    code = "files_quota_exceeded"

    def __init__(self, refused: OverQuota) -> None:
        whose = "Your project's files" if refused.project_id else "This key's files (it is in no project)"
        super().__init__(
            f"{whose} hold {refused.used} bytes; this file's {refused.size} would pass their quota of "
            f"{refused.quota} bytes ({QUOTA_SETTING} in the cluster settings). Delete files no longer needed "
            f"(DELETE /v1/files/{{file_id}}), or ask an operator to raise {QUOTA_SETTING}.",
            param="file",
        )


def caller_of(key: KeyEntry | None) -> tuple[str, str]:
    """(key id, project id) that own what a caller creates and bound what it sees; ("", "") for an anonymous caller."""
    if key is None:
        return "", ""
    return key.id, getattr(key, "project_id", "")


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": int(record.created_at.timestamp()),
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
    }


def page(objects: Sequence[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor page of ``objects`` (in the listing's order): those after the id ``after``, at most ``limit``."""
    start = 0
    if after:
        ids = [o["id"] for o in objects]
        if after not in ids:
            raise BadRequest(
                f"after: {after!r} is not an id of this listing; pass the last_id of the previous page", param="after"
            )
        start = ids.index(after) + 1
    data = list(objects[start : start + limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(objects),
    }


def limit_arg(text: str | None, default: int, most: int) -> int:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"limit: {text!r} is not a whole number", param="limit") from None
    if not 1 <= value <= most:
        raise BadRequest(f"limit: {value} is out of range; give 1 to {most}", param="limit")
    return value


class ClientFiles:
    """The ``/v1/files`` routes over the store."""

    def __init__(self, store: Store, authenticate: Authenticate, project_bytes: Callable[[], int]) -> None:
        self.store = store
        self.authenticate = authenticate
        self.project_bytes = project_bytes
        """The settings' ``files.project_bytes`` in force, read at each upload."""

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files", self.listing, methods=["GET"]),
            Route("/v1/files/{file_id}", self.one, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
        ]

    async def answer(self, request: Request, work: Callable[[KeyEntry | None], Any]) -> Response:
        request_id = sane_request_id(headers_of(request).get(b"x-request-id"))
        try:
            key = self.authenticate(headers_of(request))
            answer = await work(key)
        except GatewayError as err:
            return error_response(err, request_id)
        if isinstance(answer, Response):
            answer.headers["X-Request-Id"] = request_id
            return answer
        return JSONResponse(answer, headers={"X-Request-Id": request_id})

    async def visible(self, key: KeyEntry | None, file_id: str) -> FileRecord:
        key_id, project_id = caller_of(key)
        record = await run_sync(self.store.get_file, file_id, key_id=key_id, project_id=project_id)
        if record is None:
            raise NotFoundHere(f"No file with id {file_id!r} (GET /v1/files lists yours).", param="file_id")
        return record

    async def upload(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > FILE_MAX_BYTES + FORM_SLACK:
                raise BodyTooLarge(FILE_MAX_BYTES)
            if not request.headers.get("content-type", "").startswith("multipart/form-data"):
                raise BadRequest("Upload a file as multipart/form-data with the fields `file` and `purpose`.")
            parser = MultiPartParser(
                request.headers, _bounded(request, FILE_MAX_BYTES + FORM_SLACK), max_files=1, max_fields=8
            )
            try:
                form = await parser.parse()
            except MultiPartException as err:
                raise BadRequest(f"The multipart body does not parse: {err.message}") from None
            try:
                purpose, upload = form.get("purpose"), form.get("file")
                if not isinstance(purpose, str) or purpose not in PURPOSES:
                    raise BadRequest(
                        f"purpose: {purpose!r} is not one this server takes; send purpose=batch", param="purpose"
                    )
                if not isinstance(upload, UploadFile):
                    raise BadRequest("file: no file in the upload; send it as the multipart field `file`", param="file")
                if (upload.size or 0) > FILE_MAX_BYTES:
                    raise BodyTooLarge(FILE_MAX_BYTES)
                key_id, project_id = caller_of(key)
                try:
                    record = await run_sync(
                        self.store.add_file,
                        owner_key_id=key_id,
                        project_id=project_id,
                        purpose=purpose,
                        filename=upload.filename or "upload.jsonl",
                        content=upload.file,
                        quota=self.project_bytes(),
                    )
                except OverQuota as refused:
                    raise FilesQuotaExceeded(refused) from None
            finally:
                await form.close()
            return file_object(record)

        return await self.answer(request, work)

    async def listing(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            query = request.query_params
            order = query.get("order", "desc")
            if order not in ("asc", "desc"):
                raise BadRequest(f"order: {order!r} is neither asc nor desc", param="order")
            limit = limit_arg(query.get("limit"), 10_000, 10_000)
            key_id, project_id = caller_of(key)
            records = await run_sync(
                self.store.list_files,
                key_id=key_id,
                project_id=project_id,
                purpose=query.get("purpose") or None,
                newest_first=order == "desc",
            )
            return page([file_object(r) for r in records], query.get("after"), limit)

        return await self.answer(request, work)

    async def one(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            return file_object(await self.visible(key, request.path_params["file_id"]))

        return await self.answer(request, work)

    async def content(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> Response:
            record = await self.visible(key, request.path_params["file_id"])
            return StreamingResponse(
                self._chunks(record),
                media_type="application/jsonl",
                headers={
                    "Content-Disposition": f'attachment; filename="{record.filename.replace(chr(34), "")}"',
                    "Content-Length": str(record.bytes),
                },
            )

        return await self.answer(request, work)

    async def _chunks(self, record: FileRecord) -> AsyncIterator[bytes]:
        """The file's content from the store, a chunk at a time; it ends early if the file is deleted meanwhile."""
        seq = 0
        while (chunk := await run_sync(self.store.file_chunk, record.id, seq)) is not None:
            yield chunk
            seq += 1

    async def delete(self, request: Request) -> Response:
        async def work(key: KeyEntry | None) -> dict[str, Any]:
            record = await self.visible(key, request.path_params["file_id"])
            deleted = await run_sync(self.store.delete_file, record.id)
            return {"id": record.id, "object": "file", "deleted": deleted}

        return await self.answer(request, work)


async def _bounded(request: Request, most: int) -> AsyncGenerator[bytes, None]:
    """The request's body as it arrives; BodyTooLarge once more than ``most`` bytes came (a body of no stated length too)."""
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > most:
            raise BodyTooLarge(FILE_MAX_BYTES)
        yield chunk
