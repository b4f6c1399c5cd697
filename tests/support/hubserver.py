"""A loopback Hugging Face Hub for tests: the file API, a separate "CDN" origin, and fault injection.

What it speaks, as the real hub does:

- ``GET /api/models/{owner}/{name}`` and ``…/revision/{rev}``: model info (``id``, ``sha``, ``siblings``);
- ``GET /api/models/{owner}/{name}/tree/{rev}?recursive=true``: files with ``size``, git ``oid`` and,
  for LFS files, ``lfs.oid`` (the SHA-256); paged with a ``Link: …; rel="next"`` header when
  ``tree_page_size`` is set;
- ``GET``/``HEAD /{owner}/{name}/resolve/{rev}/{path}``: an LFS file answers ``302`` to the CDN
  origin (another port) with ``X-Linked-Etag``, ``X-Linked-Size``, ``X-Repo-Commit`` and ``ETag``;
  a small file is served in place with its git oid as ``ETag``. Both honour ``Range``;
- errors with ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``) and ``X-Error-Message``; a repo can require ``Authorization: Bearer <token>``.

Faults: :meth:`HubServer.cut_after` closes the connection after K body bytes (once, or N times),
:meth:`HubServer.corrupt` serves damaged bytes under the right headers, :meth:`HubServer.fail`
answers with an error status (a 503 by default), ``ignore_range`` answers every ranged request
with the whole file. Every request is logged in :attr:`HubServer.requests`.

Use it from an async test or fixture::

    async with HubServer() as hub:
        hub.add_tiny_gguf("acme/tiny-GGUF")
        ...  # hub.url is the HF_ENDPOINT

or from synchronous code (a CLI test), where it runs on its own thread::

    with HubServer().running_in_thread() as hub:
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from aiohttp import web

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".onnx")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class HubRequest:
    method: str
    path: str
    """The raw path (percent-escapes kept), without the query."""
    query: str
    headers: dict[str, str]
    origin: str
    """``hub`` or ``cdn``: which listener received it."""

    @property
    def range(self) -> str | None:
        return self.headers.get("Range")


@dataclass
class _File:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(f"blob {len(self.data)}\0".encode() + self.data).hexdigest()


@dataclass
class _Repo:
    id: str
    revisions: dict[str, dict[str, _File]] = field(default_factory=dict)
    token: str | None = None
    gated: bool = False

    def commit(self, revision: str) -> str:
        files = self.revisions[revision]
        text = self.id + revision + "".join(f"{p}:{f.sha256}" for p, f in sorted(files.items()))
        return hashlib.sha1(text.encode()).hexdigest()

    def find(self, revision: str) -> str | None:
        """The revision name for a branch name or a commit id."""
        if revision in self.revisions:
            return revision
        return next((name for name in self.revisions if self.commit(name) == revision), None)


@dataclass
class _Fault:
    path: str
    remaining: int | None
    """How many more responses it applies to; None = every one."""
    cut_after: int | None = None
    corrupt: bool = False
    status: int | None = None


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response(
        {"error": message}, status=status, headers={"X-Error-Code": code, "X-Error-Message": message}
    )


class HubServer:
    """The loopback hub. ``url`` is its base URL (an ``HF_ENDPOINT``); ``cdn_url`` is the redirect target."""

    def __init__(
        self, *, lfs_threshold: int = 10 * 1024, tree_page_size: int | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.host = host
        self.lfs_threshold = lfs_threshold
        self.tree_page_size = tree_page_size
        self.ignore_range = False
        self.requests: list[HubRequest] = []
        self._repos: dict[str, _Repo] = {}
        self._faults: list[_Fault] = []
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.cdn_port = 0

    # ---- content

    def add_file(self, repo: str, path: str, data: bytes, *, revision: str = "main", lfs: bool | None = None) -> str:
        """Put a file in a repository at a revision; returns its SHA-256."""
        record = self._repos.setdefault(repo, _Repo(repo))
        if lfs is None:
            lfs = len(data) >= self.lfs_threshold or path.lower().endswith(LFS_SUFFIXES)
        record.revisions.setdefault(revision, {})[path] = _File(bytes(data), lfs)
        return hashlib.sha256(data).hexdigest()

    def add_tiny_gguf(
        self,
        repo: str,
        path: str = "tiny-Q4_K_M.gguf",
        *,
        revision: str = "main",
        seed: int = 0,
        says: str | None = None,
        **shape: int,
    ) -> bytes:
        """A tiny llama GGUF made by opod (``write_tiny_llama``; ``says``: the word it answers everything with);
        returns its bytes."""
        from opod.weights.tiny import write_tiny_llama

        with tempfile.TemporaryDirectory() as scratch:
            data = write_tiny_llama(Path(scratch) / "tiny.gguf", seed=seed, says=says, **shape).read_bytes()
        self.add_file(repo, path, data, revision=revision, lfs=True)
        return data

    def require_token(self, repo: str, token: str, *, gated: bool = True) -> None:
        """Refuse the repository without ``Authorization: Bearer <token>`` (gated: 401/403 ``GatedRepo``)."""
        record = self._repos.setdefault(repo, _Repo(repo))
        record.token, record.gated = token, gated

    def commit(self, repo: str, revision: str = "main") -> str:
        return self._repos[repo].commit(revision)

    def keep_commit(self, repo: str, revision: str = "main") -> str:
        """Keep what ``revision`` holds now under its commit id, so that commit still resolves after the branch moves
        on (as the Hub keeps every commit); returns the id."""
        record = self._repos[repo]
        commit = record.commit(revision)
        record.revisions[commit] = dict(record.revisions[revision])
        return commit

    # ---- faults

    def cut_after(self, path: str, nbytes: int, *, times: int | None = 1) -> None:
        """Close the connection after ``nbytes`` body bytes of ``path`` (any repo), for the next ``times`` responses."""
        self._faults.append(_Fault(path, times, cut_after=nbytes))

    def corrupt(self, path: str, *, times: int | None = None) -> None:
        """Serve ``path`` with damaged bytes (its headers still name the true digest)."""
        self._faults.append(_Fault(path, times, corrupt=True))

    def fail(self, path: str, status: int = 503, *, times: int | None = 1) -> None:
        """Answer requests for ``path`` (resolve or CDN) with an error status, for the next ``times`` responses."""
        self._faults.append(_Fault(path, times, status=status))

    def clear_faults(self) -> None:
        self._faults.clear()

    def _take_faults(self, path: str) -> list[_Fault]:
        taken = []
        for fault in self._faults:
            if fault.path == path and (fault.remaining is None or fault.remaining > 0):
                if fault.remaining is not None:
                    fault.remaining -= 1
                taken.append(fault)
        return taken

    # ---- request log

    def requests_for(self, suffix: str, method: str | None = None) -> list[HubRequest]:
        """Logged requests whose unescaped path ends with ``suffix``."""
        return [r for r in self.requests if unquote(r.path).endswith(suffix) and (method is None or r.method == method)]

    # ---- lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def cdn_url(self) -> str:
        return f"http://{self.host}:{self.cdn_port}"

    async def start(self) -> HubServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        hub = web.TCPSite(self._runner, self.host, 0)
        cdn = web.TCPSite(self._runner, self.host, 0)
        await hub.start()
        await cdn.start()
        self.port = hub._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.cdn_port = cdn._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> HubServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def running_in_thread(self) -> Iterator[HubServer]:
        """Run the server on its own event loop in a thread, for synchronous tests."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        thread = threading.Thread(target=loop.run_forever, name="hubserver", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)
            ready.set()
            yield self
        finally:
            if ready.is_set():
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()

    # ---- handlers

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw = request.raw_path.split("?", 1)[0]
        origin = (
            "cdn" if request.transport and request.transport.get_extra_info("sockname")[1] == self.cdn_port else "hub"
        )
        self.requests.append(HubRequest(request.method, raw, request.query_string, dict(request.headers), origin))
        parts = [unquote(p) for p in raw.strip("/").split("/")]
        if parts[:1] == ["_cdn"] and len(parts) == 2:
            return await self._cdn(request, parts[1])
        if request.method not in ("GET", "HEAD"):
            return _error(405, "MethodNotAllowed", f"{request.method} is not served here")
        if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] == "models":
            repo_id = f"{parts[2]}/{parts[3]}"
            rest = parts[4:]
            if not rest:
                return self._info(request, repo_id, "main")
            if len(rest) == 2 and rest[0] == "revision":
                return self._info(request, repo_id, rest[1])
            if len(rest) >= 2 and rest[0] == "tree":
                return self._tree(request, repo_id, rest[1], "/".join(rest[2:]))
        if len(parts) >= 5 and parts[2] == "resolve":
            return await self._resolve(request, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        return _error(404, "NotFound", f"no route {raw}")

    def _repo(self, request: web.Request, repo_id: str, revision: str) -> tuple[_Repo, str] | web.Response:
        record = self._repos.get(repo_id)
        sent = request.headers.get("Authorization")
        if record is None or not record.revisions:
            # Like the hub: without credentials, "missing" and "private" look the same (401).
            if sent is None:
                return _error(
                    401,
                    "RepoNotFound",
                    f"Repository Not Found for url: {request.url}. Please make sure you are authenticated.",
                )
            return _error(404, "RepoNotFound", f"Repository Not Found for url: {request.url}.")
        if record.token is not None and sent != f"Bearer {record.token}":
            if record.gated:
                if sent is None:
                    return _error(
                        401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                    )
                return _error(
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit the model page to ask for access.",
                )
            return _error(
                401, "RepoNotFound", "Invalid credentials in Authorization header" if sent else "Repository Not Found"
            )
        name = record.find(revision)
        if name is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return record, name

    def _info(self, request: web.Request, repo_id: str, revision: str) -> web.Response:
        found = self._repo(request, repo_id, revision)
        if isinstance(found, web.Response):
            return found
        record, name = found
        files = record.revisions[name]
        return web.json_response(
            {
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": record.commit(name),
                "private": record.token is not None and not record.gated,
                "gated": "manual" if record.gated else False,
                "disabled": False,
                "tags": ["gguf"] if any(p.endswith(".gguf") for p in files) else [],
                "library_name": "gguf" if any(p.endswith(".gguf") for p in files) else None,
                "siblings": [{"rfilename": p} for p in sorted(files)],
            }
        )

    def _tree(self, request: web.Request, repo_id: str, revision: str, under: str) -> web.Response:
        found = self._repo(request, repo_id, revision)
        if isinstance(found, web.Response):
            return found
        record, name = found
        recursive = request.query.get("recursive", "").lower() in ("1", "true")
        entries: list[dict] = []
        dirs: set[str] = set()
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        for path, f in sorted(record.revisions[name].items()):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :]
            if "/" in rel and not recursive:
                dirs.add(prefix + rel.split("/", 1)[0])
                continue
            for i, _ in enumerate(rel.split("/")[:-1]):
                dirs.add(prefix + "/".join(rel.split("/")[: i + 1]))
            entry: dict = {"type": "file", "oid": f.git_oid, "size": len(f.data), "path": path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            entries.append(entry)
        entries = [
            {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
            for d in sorted(dirs)
        ] + entries
        headers = {}
        if self.tree_page_size:
            start = int(request.query.get("cursor", "0"))
            end = start + self.tree_page_size
            if end < len(entries):
                query = f"recursive={'true' if recursive else 'false'}&cursor={end}"
                headers["Link"] = f'<{self.url}{request.raw_path.split("?", 1)[0]}?{query}>; rel="next"'
            entries = entries[start:end]
        return web.json_response(entries, headers=headers)

    async def _resolve(self, request: web.Request, repo_id: str, revision: str, path: str) -> web.StreamResponse:
        found = self._repo(request, repo_id, revision)
        if isinstance(found, web.Response):
            return found
        record, name = found
        f = record.revisions[name].get(path)
        if f is None:
            return _error(404, "EntryNotFound", f'{path} does not exist on "{revision}"')
        commit = record.commit(name)
        if f.lfs:
            headers = {
                "Location": f"{self.cdn_url}/_cdn/{f.sha256}?name={quote(path, safe='')}",
                "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": str(len(f.data)),
                "ETag": f'"{f.sha256}"',
                "Content-Type": "text/plain; charset=utf-8",
            }
            return web.Response(status=302, headers=headers, text="Found. Redirecting to the CDN")
        return await self._body(request, path, f.data, {"ETag": f'"{f.git_oid}"', "X-Repo-Commit": commit})

    async def _cdn(self, request: web.Request, sha256: str) -> web.StreamResponse:
        for record in self._repos.values():
            for files in record.revisions.values():
                for path, f in files.items():
                    if f.sha256 == sha256:
                        return await self._body(request, path, f.data, {"ETag": f'"{sha256}"'})
        return web.Response(status=404, text="NoSuchKey")

    async def _body(self, request: web.Request, path: str, data: bytes, headers: dict[str, str]) -> web.StreamResponse:
        """Serve ``data`` with ``Range`` support and any faults registered for ``path``."""
        status, start, end = 200, 0, len(data)
        wanted = request.headers.get("Range")
        extra = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
        if wanted and not self.ignore_range:
            match = _RANGE.match(wanted.strip())
            if match is None or int(match.group(1)) >= len(data):
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            start = int(match.group(1))
            end = min(int(match.group(2)) + 1, len(data)) if match.group(2) else len(data)
            status = 206
            extra["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        body = data[start:end]
        response = web.StreamResponse(status=status, headers=extra)
        response.content_length = len(body)
        if request.method == "HEAD":
            await response.prepare(request)
            return response
        faults = self._take_faults(path)
        failing = next((f.status for f in faults if f.status is not None), None)
        if failing is not None:
            return web.json_response({"error": "injected failure"}, status=failing)
        if any(f.corrupt for f in faults) and body:
            damaged = bytearray(body)
            for i in range(0, len(damaged), max(1, len(damaged) // 7)):
                damaged[i] ^= 0xFF
            body = bytes(damaged)
        cut = min((f.cut_after for f in faults if f.cut_after is not None), default=None)
        await response.prepare(request)
        if cut is not None and cut < len(body):
            await response.write(body[:cut])
            # Let the bytes leave, then drop the connection mid-body, as a failing network does.
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError
        await response.write(body)
        await response.write_eof()
        return response
