"""The engines a worker runs: one engine process per loaded model, started on request.

A load is accepted at once and carried out in the background (the weights may
take minutes to arrive): resolve the catalog source to a local file, start the
engine with its driver's argv under the supervisor, and report it in
``loaded_models`` once it answers its readiness probe. An engine that dies with
SIGILL (a prebuilt llama-server on a CPU without AVX-512) is started again on
the portable build (:mod:`opod.worker.engine_fallback`), and the reason is said in the engine state. An
engine whose port another program took before the engine bound it starts again on a new port
(:mod:`opod.worker.engine_ports`).

An engine whose driver publishes KV-cache events gets a listener of its own
(:mod:`opod.worker.kvlistener`), started before the engine and closed after it;
all of them feed one :class:`~opod.worker.kvevents.KVReport`, which each
heartbeat drains (:meth:`EngineManager.kv_blocks`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from opod import weights
from opod.catalog import Catalog
from opod.contract import nodeapi
from opod.contract.catalog import Entry, Hardware, Source
from opod.engines.base import LaunchSpec, LoadSample, combined
from opod.engines.registry import get_driver
from opod.http import cpu
from opod.http.upstream import Upstreams
from opod.weights.progress import FetchMeter
from opod.worker import multinode
from opod.worker.adapters import Adapters, lora_flags
from opod.worker.engine_fallback import DiedOfSigill, fallback_spec, wants_fallback
from opod.worker.engine_ports import PORT_MOVES, lost_its_port, move_to_a_new_port
from opod.worker.kvevents import KVReport
from opod.worker.kvlistener import KVEventListener, KVListenError
from opod.worker.model_engine import ModelEngine, free_port, one_word
from opod.worker.multinode import device_env, ranks_of, replica_flags
from opod.worker.refusals import LoadRefused
from opod.worker.supervisor import ProcessConfig, ProcessState, Supervisor

log = logging.getLogger("opod.worker")

CPU_CONTEXT_CAP = 8192
"""Default context on a CPU engine: a catalog's 128K window would reserve gigabytes of KV cache."""
DEFAULT_PARALLEL = 4


class EngineManager:
    def __init__(
        self,
        *,
        engine_id: str,
        home: Path,
        catalog: Catalog,
        supervisor: Supervisor,
        threads: int = 0,
        flags: dict[str, object] | None = None,
        sleep_mode: bool = False,
        on_change: Callable[[], None] = lambda: None,
        adapters: list[nodeapi.Adapter] | None = None,
        launcher: Callable[[str], tuple[str, ...]] = lambda _engine: (),
        died_of_sigill: DiedOfSigill = lambda _engine, _prefix: None,
    ) -> None:
        """``launcher``: the command prefix an engine id starts with now (the operator's build choice; empty = the driver's).
        ``died_of_sigill``: told the engine id and the command prefix of an engine that died with SIGILL and
        starts again on another build, so the next start can skip the crash."""
        self.driver = get_driver(engine_id)
        self.launcher = launcher
        self.died_of_sigill = died_of_sigill
        self.home = home
        self.catalog = catalog
        self.supervisor = supervisor
        self.threads = threads
        self.flags = lora_flags(self.driver, flags or {}, adapters or [])
        self.adapters = Adapters(self.driver, lambda: self.session, self._engine_of, adapters, self._weights_of)
        self._reconciling: asyncio.Task[None] | None = None
        self.sleep_mode = sleep_mode
        self.on_change = on_change
        self.engines: dict[str, ModelEngine] = {}
        self.sleeping = False
        self.kv_report: KVReport | None = None
        if self.driver.publishes_kv_events:
            # Cache changes ask for an early heartbeat through on_change (the report debounces them).
            self.kv_report = KVReport(on_pending=lambda: self.on_change())
        (home / "logs").mkdir(parents=True, exist_ok=True)
        self._session: aiohttp.ClientSession | None = None
        self.upstream = Upstreams()
        """Keep-alive connections for relaying ``/v1`` requests to the engines."""

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60), auto_decompress=False
            )
        return self._session

    # --- loading ------------------------------------------------------------

    def entry_for(self, req: nodeapi.LoadModelRequest) -> Entry | None:
        return self.catalog.get(req.id)

    async def load(self, req: nodeapi.LoadModelRequest) -> nodeapi.LoadModelResponse:
        if not req.id:
            raise LoadRefused(400, "LoadModelRequest: id: required (the catalog id the model is served under)")
        current = self.engines.get(req.id)
        if current is not None and current.state in ("fetching", "starting", "serving", "following"):
            return nodeapi.LoadModelResponse(status=nodeapi.Status.READY, model=req.id)
        try:
            ranks = ranks_of(req.rank, req.peers)
        except ValueError as err:
            raise LoadRefused(400, f"LoadModelRequest: {err}") from err
        source = self._source(req)
        self.adapters.define(req.id, req.adapters or [])
        if current is not None:
            await self._stop_kv(current)  # a failed or stopped engine's listener; the new one gets its own
        engine = ModelEngine(
            model_id=req.id,
            driver=self.driver,
            replica=req.replica,
            profile=req.profile,
            fingerprint=req.fingerprint,
            devices=req.devices,
            env=device_env(req.devices, req.env),
            ranks=ranks,
        )
        self.engines[req.id] = engine
        if engine.follower and self.driver.id not in ("vllm", "sglang"):
            # The simulator (and any engine without a runtime of its own here): rank 0 serves alone.
            engine.enter(
                "following",
                f"{req.id}: rank {req.rank} of {ranks.nodes if ranks else 1}, serving from {req.peers[0] if req.peers else '?'}",
            )
            log.info("%s", engine.detail)
            self.on_change()
            return nodeapi.LoadModelResponse(status=nodeapi.Status.READY, model=req.id)
        engine.task = asyncio.get_running_loop().create_task(self._bring_up(engine, req, source))
        self.on_change()
        return nodeapi.LoadModelResponse(status=nodeapi.Status.READY, model=req.id)

    def _source(self, req: nodeapi.LoadModelRequest) -> Source | None:
        """Where the weights come from; ``None`` when the engine loads by name (simulator, Ollama)."""
        if self.driver.native in ("id", "ollama_name"):
            return None
        if req.path and Path(req.path).is_file():
            # A path the leader sent that exists here wins: an uploaded file (a shard's weights) or a shared mount.
            return Source(type="file", path=req.path)
        entry = self.entry_for(req)
        if entry is not None:
            return entry.source
        if req.path:
            return Source(type="file", path=req.path)
        if req.repo:
            return Source(type="huggingface", repo=req.repo, file=req.file, revision=req.revision)
        raise LoadRefused(
            400,
            f"model {req.id!r} is not in this worker's catalog and the request names no path or repo to load it from",
        )

    async def _bring_up(self, engine: ModelEngine, req: nodeapi.LoadModelRequest, source: Source | None) -> None:
        entry = self.entry_for(req)
        try:
            model_ref = req.id
            if source is not None:
                model_ref = str(await self._fetch(engine, req, source, entry))
            caps = entry.capabilities if entry is not None else ["chat"]
            # A load's own flags (the RPC parts of a sharded model) pin over the worker's plan flags.
            flags = replica_flags(
                {**self.flags, **(req.flags or {})}, self.driver.flag_keys, tp=req.tp, pp=req.pp, args=req.args
            )
            context = int(flags.get("ctx") or 0) or min(
                entry.context_window if entry else CPU_CONTEXT_CAP, CPU_CONTEXT_CAP
            )
            engine.port = free_port()
            kv_endpoint = self._listen(engine, caps)
            engine.spec = LaunchSpec(
                model_id=req.id,
                model=model_ref,
                port=engine.port,
                context=context,
                parallel=int(flags.get("np") or 0) or DEFAULT_PARALLEL,
                threads=self.threads,
                embeddings="embedding" in caps,
                rerank="rerank" in caps,
                flags=flags,
                kv_events_endpoint=kv_endpoint,
                tool_call_parser=(entry.tool_call_parser or {}).get(self.driver.id, "")
                if entry is not None and "tools" in caps
                else "",
                sleep_mode=self.sleep_mode,
                launcher=self.launcher(self.driver.id),
            )
            await self._distributed(engine)
            await self._start(engine)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # any failure of a background load is reported, never lost
            log.error("loading %s failed: %s", req.id, err)
            engine.enter("failed", f"{req.id}: {err}")
            await self._stop_kv(engine)
            self.on_change()

    async def _fetch(
        self, engine: ModelEngine, req: nodeapi.LoadModelRequest, source: Source, entry: Entry | None
    ) -> Path:
        meter = FetchMeter(f"{req.id}: fetching weights", say=log.info)

        def progress(done: int, total: int | None) -> None:
            meter(done, total)
            engine.detail = meter.describe()  # size, share and rate: what the heartbeat's load_progress says

        target = entry or Entry(
            id=req.id,
            display_name=req.id,
            source=source,
            size_bytes=1,
            context_window=CPU_CONTEXT_CAP,
            capabilities=["chat"],
            recommended_engines=[self.driver.id],
            hardware=Hardware(min_ram_gb=0),
            tags=[],
        )
        engine.enter("fetching", f"{req.id}: fetching weights")
        return await weights.aresolve(target, self.home, progress=progress)

    async def _distributed(self, engine: ModelEngine) -> None:
        """A replica across nodes: the engine's own runtime on this rank (Ray for vLLM, SGLang's launcher flags)."""
        ranks, spec = engine.ranks, engine.spec
        if ranks is None or spec is None:
            return
        if self.driver.id == "sglang":
            engine.extra_argv = multinode.sglang_args(ranks)
        elif self.driver.id == "vllm" and ranks.rank == 0:
            engine.extra_argv = multinode.vllm_rank0_args(ranks)
            engine.env.update(multinode.vllm_rank0_env(ranks))
            head = ProcessConfig(
                id=f"engine-{engine.model_id}-ray",
                argv=multinode.ray_head_argv(spec.binary),
                env=dict(engine.env),
                restart=True,
                max_restarts=5,
                backoff=1.0,
                log_lines=200,
                log_file=self.home / "logs" / f"engine-{engine.model_id}-ray.log",
            )
            await self._restart_process(head)

    def _argv(self, engine: ModelEngine) -> list[str]:
        assert engine.spec is not None
        if engine.follower and self.driver.id == "vllm" and engine.ranks is not None:
            return multinode.ray_worker_argv(engine.ranks, engine.spec.binary)
        return self.driver.argv(engine.spec) + engine.extra_argv

    async def _restart_process(self, config: ProcessConfig) -> None:
        previous = self.supervisor.get(config.id)
        if previous is not None:
            if previous.live:
                await self.supervisor.stop(config.id)
            self.supervisor.forget(config.id)
        await self.supervisor.start(config)

    async def _start(self, engine: ModelEngine, port_moves: int = 0) -> None:
        """``port_moves``: how many times this start already moved to a new port because its own was taken."""
        assert engine.spec is not None
        argv = self._argv(engine)
        engine.process_id = f"engine-{engine.model_id}"
        engine.enter("starting", f"{engine.model_id}: starting {self.driver.id}")
        self.on_change()
        config = ProcessConfig(
            id=engine.process_id,
            argv=argv,
            env={**self.driver.env(engine.spec), **engine.env},
            # A follower rank answers no HTTP: it is up once its process runs.
            ready_url=None if engine.follower else engine.base_url + self.driver.health_path,
            ready_timeout=600.0,
            restart=True,
            max_restarts=5,
            backoff=1.0,
            log_lines=200,
            log_file=self.home / "logs" / f"{engine.process_id}.log",
            cpus=sorted(cpu.engine_cpus(self.driver.computes_on_cpu) or ()),
        )
        previous = self.supervisor.get(engine.process_id)
        if previous is not None:
            if previous.live:
                await self.supervisor.stop(engine.process_id)
            self.supervisor.forget(engine.process_id)
        await self.supervisor.start(config)
        ready = await self._await_ready(engine.process_id, config.ready_timeout, engine)
        if ready and engine.follower:
            engine.enter(
                "following",
                f"{engine.model_id}: rank {engine.ranks.rank if engine.ranks else 0} of a replica across nodes",
            )
        elif ready:
            engine.enter("serving")
            log.info("%s serving on %s", engine.model_id, engine.base_url)
        else:
            process = self.supervisor.get(engine.process_id)
            # Another program took the port before the engine bound it: restarting there would only crash-loop.
            if process is not None and port_moves < PORT_MOVES and lost_its_port(engine):
                await self.supervisor.stop(engine.process_id)
                move_to_a_new_port(engine)
                await self._start(engine, port_moves + 1)
                return
            fallback = fallback_spec(self.driver, engine, process, self.died_of_sigill)
            if fallback is not None:
                await self.supervisor.stop(engine.process_id)
                engine.spec = fallback
                await self._start(engine)
                return
            reason = process.exit_reason if process is not None else "did not start"
            tail = process.last_lines(3) if process is not None else []
            engine.enter("failed", f"{engine.model_id}: {reason}" + (f" ({tail[-1]})" if tail else ""))
            await self._stop_kv(engine)
        self.on_change()

    async def _await_ready(self, process_id: str, timeout: float, engine: ModelEngine | None = None) -> bool:
        """Ready, or not: stops waiting at the first exit that a fallback can answer (SIGILL), or, for ``engine``,
        at the first exit with its port taken by another program."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.supervisor.get(process_id)
            if process is None:
                return False
            if process.ready:
                return True
            if not process.live or (process.exit_code is not None and wants_fallback(self.driver, process.exit_code)):
                return False
            if engine is not None and process.state is ProcessState.BACKOFF and lost_its_port(engine):
                return False
            await asyncio.sleep(0.1)
        return False

    # --- taking engines back after the worker re-executed itself -------------------

    def adopt(self, engine: ModelEngine) -> asyncio.Task[None] | None:
        """Take back ``engine``, whose process the supervisor has adopted (:mod:`opod.worker.adoption`): it is
        ``starting`` until its process answers its readiness probe, then serving as before. Returns the task
        that waits for that (None for a follower rank without a process of its own)."""
        self.engines[engine.model_id] = engine
        endpoint = engine.spec.kv_events_endpoint if engine.spec is not None else ""
        if endpoint and self.kv_report is not None:
            # The endpoint the engine was started with: it dials this same address again.
            listener = KVEventListener(self.kv_report, name=engine.model_id, endpoint=endpoint)
            try:
                listener.start()
                engine.kv = listener
            except KVListenError as err:
                log.warning("%s; %s goes on without cache events", err, engine.model_id)
        if not engine.process_id:
            self.on_change()
            return None
        engine.enter("starting", f"{engine.model_id}: taken back after the worker restarted")
        engine.task = asyncio.get_running_loop().create_task(
            self._taken_back(engine), name=f"take back {engine.model_id}"
        )
        self.on_change()
        return engine.task

    async def _taken_back(self, engine: ModelEngine) -> None:
        process = self.supervisor.get(engine.process_id)
        timeout = process.config.ready_timeout if process is not None else 0.0
        if await self._await_ready(engine.process_id, timeout):
            engine.enter("following" if engine.follower else "serving", engine.detail if engine.follower else "")
            log.info("%s serving again on %s (its engine kept running)", engine.model_id, engine.base_url)
        else:
            process = self.supervisor.get(engine.process_id)
            engine.enter(
                "failed", f"{engine.model_id}: " + (process.exit_reason if process is not None else "not taken back")
            )
            await self._stop_kv(engine)
        self.on_change()

    # --- unloading ------------------------------------------------------------

    async def unload(self, req: nodeapi.UnloadModelRequest) -> nodeapi.UnloadModelResponse:
        held = self.adapters.attached.get(req.id)
        if held is not None:  # an adapter named as a model: detach it (its base may hold a ':' itself)
            await self.adapters.detach(nodeapi.UnloadAdapterRequest(base=held.base, name=held.name))
            self.on_change()
            return nodeapi.UnloadModelResponse(status=nodeapi.Status.UNLOADED, model=req.id)
        riding = self.adapters.attached_by_a_manager(req.id)
        if riding and req.id in self.engines:
            raise LoadRefused(
                409, f"adapters are attached to {req.id!r} on this worker ({', '.join(riding)}); unload them first"
            )
        self.adapters.forget(req.id)  # OPOD_ADAPTERS' adapters go with their base and come back when it is loaded again
        engine = self.engines.pop(req.id, None)
        if engine is None:
            return nodeapi.UnloadModelResponse(
                status=nodeapi.Status.NOOP, model=req.id, reason="not resident in this worker's engine"
            )
        if engine.task is not None and not engine.task.done():
            engine.task.cancel()
        if engine.process_id:
            await self.supervisor.stop(engine.process_id)
        if self.supervisor.get(f"engine-{req.id}-ray") is not None:
            await self.supervisor.stop(f"engine-{req.id}-ray")
        await self._stop_kv(engine)
        self.on_change()
        return nodeapi.UnloadModelResponse(status=nodeapi.Status.UNLOADED, model=req.id)

    async def stop_all(self) -> None:
        if self._reconciling is not None:
            self._reconciling.cancel()
        for engine in list(self.engines.values()):
            if engine.task is not None and not engine.task.done():
                engine.task.cancel()
        await self.supervisor.stop_all(grace=10.0)
        for engine in self.engines.values():
            engine.enter("stopped")
            await self._stop_kv(engine)
        if self.kv_report is not None:
            self.kv_report.close()
        await self.upstream.close()
        if self._session is not None:
            await self._session.close()

    # --- KV-cache events ---------------------------------------------------------

    def _listen(self, engine: ModelEngine, caps: list[str]) -> str:
        """Start hearing the engine's cache events; the endpoint it should publish on (``""``: none)."""
        if self.kv_report is None or "embedding" in caps or "rerank" in caps:
            return ""  # pooling models share no prompt prefixes worth routing on
        if engine.kv is not None:
            return engine.kv.engine_endpoint
        listener = KVEventListener(self.kv_report, name=engine.model_id)
        try:
            endpoint = listener.start()
        except KVListenError as err:
            log.warning("%s; %s runs without cache events", err, engine.model_id)
            return ""
        engine.kv = listener
        return endpoint

    async def _stop_kv(self, engine: ModelEngine) -> None:
        if engine.kv is not None:
            listener, engine.kv = engine.kv, None
            await listener.close()

    def kv_blocks(self) -> nodeapi.KVBlocks | None:
        """This heartbeat's ``kv_blocks``: cache changes since the last one; ``None`` when no engine publishes events."""
        if self.kv_report is None:
            return None
        for engine in self.engines.values():
            process = self.supervisor.get(engine.process_id) if engine.process_id else None
            if engine.kv is None or process is None:
                continue
            # The supervisor may have relaunched the engine: its cache started empty, whatever the events said.
            if process.state in (ProcessState.STARTING, ProcessState.RUNNING) and process.started_at is not None:
                engine.kv.engine_started(process.started_at.timestamp())
            else:
                engine.kv.engine_exited()
        return self.kv_report.drain()

    def kv_lost(self) -> None:
        """The last ``kv_blocks`` may not have reached the leader: the next one starts over (``cleared``)."""
        if self.kv_report is not None:
            self.kv_report.resync()

    # --- what the heartbeat says ------------------------------------------------

    def serving(self, model_id: str) -> ModelEngine | None:
        """The engine answering for ``model_id`` (an attached adapter's is its base's), when it serves now."""
        if model_id not in self.engines:
            base = self.adapters.base_of(model_id)
            return self.serving(base) if base is not None else None
        engine = self.engines.get(model_id)
        if engine is None or engine.state != "serving":
            return None
        process = self.supervisor.get(engine.process_id)
        if process is not None and process.state.value not in ("running",):
            return None
        return engine

    def engine_urls(self) -> dict[str, str]:
        """Serving engines' loopback URLs, for a leader on the same machine (an adapter's is its base's)."""
        return {m: e.base_url for m in self.loaded_models() if (e := self.serving(m)) is not None}

    def load_progress(self) -> dict[str, str]:
        """Loads under way and how far each has come."""
        return {
            m: e.detail.split(": ", 1)[-1]
            for m, e in self.engines.items()
            if e.state in ("fetching", "starting") and e.detail
        }

    def load_errors(self) -> dict[str, str]:
        return {m: e.detail for m, e in self.engines.items() if e.state == "failed"}

    def model_context(self) -> dict[str, int]:
        """The context one request may use on each serving engine, as it was started."""
        return {
            m: e.spec.context
            for m, e in self.engines.items()
            if e.spec is not None and e.spec.context and self.serving(m)
        }

    def model_engines(self) -> dict[str, nodeapi.EngineState]:
        """Each model's engine process, in the heartbeat's words: the leader keeps a crashed model's
        neighbours serving and tells its clients why it cannot (crashed and restarting, crash-looping)."""
        out = {}
        for model, engine in self.engines.items():
            process = self.supervisor.get(engine.process_id) if engine.process_id else None
            if process is not None and engine.state != "fetching":
                out[model] = process.engine_state()
        return out

    def replicas(self) -> dict[str, nodeapi.HeldReplica]:
        """Each engine a reconciler placed, as it was asked for, while it is loading, serving or following:
        what a restarted leader adopts instead of placing again."""
        return {
            model: nodeapi.HeldReplica(
                replica=e.replica,
                profile=e.profile,
                fingerprint=e.fingerprint,
                devices=e.devices,
                rank=e.ranks.rank if e.ranks else 0,
                ranks=e.ranks.nodes if e.ranks else 0,
            )
            for model, e in self.engines.items()
            if e.replica and e.state in ("fetching", "starting", "serving", "following")
        }

    def loaded_models(self) -> list[str]:
        return sorted([m for m in self.engines if self.serving(m) is not None] + self.adapters.live())

    def _engine_of(self, model_id: str) -> tuple[str, float, int] | None:
        """A serving base model's engine: its URL, when its process started, and the LoRA rank it was started for."""
        engine = self.engines.get(model_id)
        if engine is None or self.serving(model_id) is None or engine.spec is None:
            return None
        process = self.supervisor.get(engine.process_id)
        started = process.started_at.timestamp() if process is not None and process.started_at is not None else 0.0
        return engine.base_url, started, self.driver.lora_rank(engine.spec)

    def _weights_of(self, model_id: str) -> str:
        """What the engine serving ``model_id`` loaded: a path, or a name the engine resolves itself."""
        engine = self.engines.get(model_id)
        return engine.spec.model if engine is not None and engine.spec is not None else ""

    def reconcile_adapters(self) -> asyncio.Task[None] | None:
        """Before a heartbeat: attach (again) what a restarted engine lost and the wanted adapters, in the background.

        An engine may take minutes over an adapter; the heartbeat does not wait, and a change asks for an
        early one. Returns the task doing it (one at a time), or None when there is nothing to do.
        """
        if not (self.adapters.attached or self.adapters.wanted or any(self.adapters.defined.values())):
            return None
        if self._reconciling is None or self._reconciling.done():
            self._reconciling = asyncio.get_running_loop().create_task(self._reconcile(), name="adapters")
        return self._reconciling

    async def _reconcile(self) -> None:
        if await self.adapters.reconcile([m for m in self.engines if self.serving(m) is not None]):
            self.on_change()

    def engine_state(self) -> nodeapi.EngineState:
        """One word for the worker's engines (:func:`opod.worker.model_engine.one_word`)."""
        states = []
        for engine in self.engines.values():
            process = self.supervisor.get(engine.process_id) if engine.process_id else None
            word = process.engine_state() if process is not None and engine.state != "fetching" else None
            states.append((engine, word))
        return one_word(states, any(self.serving(m) for m in self.engines))

    async def sample(self) -> tuple[LoadSample | None, int]:
        """Aggregate load over serving engines (max KV, summed queue and rate) and total slots."""
        engines = [e for e in self.engines.values() if self.serving(e.model_id)]
        if not engines:
            return None, 0
        results = await asyncio.gather(
            *(self.driver.sample(self.session, e.base_url, e.metrics, spec=e.spec) for e in engines),
            return_exceptions=True,
        )
        samples: list[LoadSample] = []
        for engine, result in zip(engines, results):
            if isinstance(result, tuple):
                engine.sample, engine.metrics = result
                samples.append(result[0])
        if not samples:
            return None, 0
        whole = combined(samples, time.time())
        return whole, whole.slots or 0
