"""The worker's listener (``:8081``): the leader → worker paths of the node protocol, and the data path.

Every route but ``/healthz`` is signed by the leader with this node's token
(``X-Opod-Auth``), replay-checked, and never accepts a bearer token. Errors are
plain text with a status code, except the contract's three typed bodies. On the
data path the worker relays bytes between the leader and the engine that holds
``X-Opod-Model``, unchanged; its own refusals carry ``X-Opod-Worker-Error`` so
the leader knows another worker may succeed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from opod.contract import nodeapi
from opod.contract.nodeauth import AuthRefused
from opod.contract.wire import WireError
from opod.http.fastpath import FastPath
from opod.http.upstream import origin
from opod.security.signer import Verifier
from opod.worker.engines import EngineManager
from opod.worker.refusals import LoadRefused, Refused
from opod.worker.supervisor import ProcessConfig, Supervisor

log = logging.getLogger("opod.worker")

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
        self.verifier = Verifier(lambda node: token if node == node_id else None)

    def app(self):
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
            Route(nodeapi.PATH_PROCESS_START, signed(self.process_start), methods=["POST"]),
            Route(nodeapi.PATH_PROCESS_STOP, signed(self.process_stop), methods=["POST"]),
            Route(nodeapi.PATH_PROCESS_LIST, signed(self.process_list), methods=["GET"]),
            Route(nodeapi.PATH_PROCESS_GET, signed(self.process_get), methods=["GET"]),
            Route(nodeapi.PATH_PROCESS_LOGS, signed(self.process_logs), methods=["GET"]),
            Route(nodeapi.PATH_PROCESS_FILE, signed(self.process_file), methods=["HEAD"]),
            Route(nodeapi.PATH_PROCESS_UPLOAD, signed(self.process_upload), methods=["POST"]),
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

    async def _read(self, request: Request, kind: type[nodeapi.WireModel]):
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

    # --- helper processes -------------------------------------------------------

    async def process_start(self, request: Request) -> Response:
        spec = await self._read(request, nodeapi.ProcessSpec)
        problem = "ProcessSpec.ID required" if not spec.id else "ProcessSpec.Command required" if not spec.command else ""
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

        async def stream():
            try:
                while chunk := await upstream.readany():
                    yield chunk
            finally:
                upstream.release()

        return StreamingResponse(stream(), status_code=upstream.status, media_type=media)

