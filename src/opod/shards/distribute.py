"""Getting the GGUF onto the coordinator's worker when the catalog source is a file on the leader.

``HEAD /v1/process/file?name=&sha256=`` asks whether the worker already holds
the file with that digest (200 + ``X-File-Path``); otherwise ``POST
/v1/process/upload`` streams it, and the worker keeps it only when the digest
matches. Either way the coordinator is loaded by the path the worker reports.
Only the coordinator needs the file: llama.cpp sends each RPC part its
tensors over the RPC connection.

Digests of large files take a while, so they are computed off the event loop
and remembered per (path, size, mtime).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import aiohttp

from opod.contract import nodeapi
from opod.contract.catalog import Source
from opod.fleet.state import NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.shards.errors import bad_request, worker_failed

CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Placed:
    path: str
    """Where the worker holds the file."""
    sha256: str
    uploaded: bool
    seconds: float


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Digests:
    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], str] = {}

    async def of(self, path: Path) -> str:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self._known:
            self._known[key] = await asyncio.to_thread(_sha256, path)
        return self._known[key]


def leader_file(model: str, source: Source) -> Path | None:
    """The GGUF on the leader for a ``file`` source (checked now, before anything starts); ``None`` for other sources."""
    if source.type != "file":
        return None
    path = Path(source.path).expanduser()
    if not path.is_file():
        raise bad_request(
            f"model {model!r}: its catalog source.path {source.path} is not a file on the leader; "
            "put the GGUF there (the leader sends it to the coordinator's worker)"
        )
    if path.name.startswith(".") or "/" in path.name:
        raise bad_request(f"model {model!r}: {path.name!r} cannot be sent as a plain file name; rename the file")
    return path


async def checked_digest(model: str, path: Path, source: Source, digests: Digests) -> str:
    digest = await digests.of(path)
    if source.sha256 and source.sha256 != digest:
        raise bad_request(
            f"model {model!r}: {path} has sha256 {digest}, but the catalog pins {source.sha256}; "
            "replace the file or correct source.sha256"
        )
    return digest


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    handle = await asyncio.to_thread(path.open, "rb")
    try:
        while chunk := await asyncio.to_thread(handle.read, CHUNK):
            yield chunk
    finally:
        handle.close()


async def place_file(workers: WorkerClient, node: NodeState, path: Path, digest: str) -> Placed:
    """The file on ``node``: found by digest, or uploaded and confirmed. Raises ShardError or WorkerUnavailable."""
    started = time.monotonic()
    query = urlencode({"name": path.name, "sha256": digest})
    url = f"{node.base_url()}{nodeapi.PATH_PROCESS_FILE}?{query}"
    headers = workers.signed_headers(node, "HEAD", nodeapi.PATH_PROCESS_FILE)
    try:
        async with workers.session.head(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            found = resp.headers.get(nodeapi.HEADER_FILE_PATH, "") if resp.status == 200 else ""
            if resp.status not in (200, 404):
                raise worker_failed(f"worker {node.id} answered HTTP {resp.status} when asked for {path.name}")
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise WorkerUnavailable(
            f"worker {node.id} at {node.address} did not answer the file check: {err or type(err).__name__}"
        ) from err
    if found:
        return Placed(found, digest, False, time.monotonic() - started)
    size = path.stat().st_size
    url = f"{node.base_url()}{nodeapi.PATH_PROCESS_UPLOAD}?{query}"
    headers = {
        **workers.signed_headers(node, "POST", nodeapi.PATH_PROCESS_UPLOAD),
        "Content-Type": "application/octet-stream",
        "Content-Length": str(size),
    }
    # No total bound: a large GGUF takes as long as the network needs; a stalled one is caught per read.
    timeout = aiohttp.ClientTimeout(total=None, connect=5, sock_read=300)
    try:
        async with workers.session.post(url, data=_chunks(path), headers=headers, timeout=timeout) as resp:
            text = await resp.text()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise WorkerUnavailable(f"sending {path.name} to worker {node.id} failed: {err or type(err).__name__}") from err
    if status != 200:
        raise worker_failed(f"worker {node.id} refused the upload of {path.name}: HTTP {status}: {text.strip()[:300]}")
    answer = nodeapi.UploadResponse.from_wire(text)
    if answer.sha256 != digest or answer.size != size:
        raise worker_failed(
            f"worker {node.id} kept {path.name} as {answer.size} bytes with sha256 {answer.sha256}, "
            f"but the leader sent {size} bytes with sha256 {digest}"
        )
    return Placed(answer.path, digest, True, time.monotonic() - started)
