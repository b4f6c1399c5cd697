"""``/v1/files`` uploads over a real store: a body too large stops as it arrives, with or without a stated length.

The routes are mounted in a Starlette app over a real SQLite store and called through httpx's ASGI
transport, the body sent as a stream the way a client without ``Content-Length`` sends it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from opod.gateway.files import ClientFiles
from opod.store import Store
from opod.store.files import FILE_MAX_BYTES

BOUNDARY = "opodboundary"


def multipart_head(filename: str = "in.jsonl") -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()


TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()
HEADERS = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(f"sqlite:///{tmp_path / 'opod.db'}") as opened:
        yield opened


def client(store: Store, project_bytes: int = 1 << 40) -> httpx.AsyncClient:
    files = ClientFiles(store, lambda headers: None, lambda: project_bytes)
    app = Starlette(routes=files.routes())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=120)


async def test_a_streamed_body_past_the_largest_file_is_refused_with_413_and_nothing_kept(store: Store) -> None:
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        yield multipart_head()
        chunk = b"x" * (1 << 20)
        while sent <= FILE_MAX_BYTES + (2 << 20):
            sent += len(chunk)
            yield chunk
        yield TAIL

    async with client(store) as http:
        answer = await http.post("/v1/files", content=body(), headers=HEADERS)
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"]["code"] == "request_too_large"
    assert store.list_files() == []
    assert sent < FILE_MAX_BYTES + (2 << 20), "the body was read to its end before it was refused"


async def test_a_body_that_is_not_multipart_is_a_400_naming_it(store: Store) -> None:
    async with client(store) as http:
        answer = await http.post(
            "/v1/files", content=b"--other\r\nnot a part", headers={"Content-Type": "multipart/form-data"}
        )
    assert answer.status_code == 400, answer.text
    assert "multipart" in answer.json()["error"]["message"]


async def test_an_upload_past_the_quota_is_a_413_naming_the_setting(store: Store) -> None:
    async with client(store, project_bytes=10) as http:
        answer = await http.post("/v1/files", content=multipart_head() + b"x" * 11 + TAIL, headers=HEADERS)
        assert answer.status_code == 413, answer.text
        error = answer.json()["error"]
        assert error["code"] == "files_quota_exceeded" and "files.project_bytes" in error["message"]
        kept = await http.post("/v1/files", content=multipart_head() + b"x" * 10 + TAIL, headers=HEADERS)
        assert kept.status_code == 200 and kept.json()["bytes"] == 10, kept.text
