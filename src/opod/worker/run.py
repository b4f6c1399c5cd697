"""A worker, assembled in one place (:func:`open_worker`): identity, inventory, the engine manager, its listener and its agent.

``opod join`` runs one on its own; ``opod up`` runs one beside the leader in the
same event loop.

Restarting the agent (``POST /v1/opod/agent/restart``) differs between the two.
``opod join``'s worker (:attr:`WorkerSettings.reexec`) restarts as a new process:
it re-executes its own program in the same process, hands its engines and its
listening socket over, and the new process takes them back
(:mod:`opod.worker.adoption`) and heartbeats under a new boot id; the engines never
stop. It upgrades itself the same way (:mod:`opod.worker.upgrade`). ``opod up``'s
worker shares its process with the leader, which an exec would restart too: it
starts its agent over in place (the inventory read again, registered anew).

Stopping it stops the engines first, then sends the final
"stopped" heartbeat, so the leader stops routing here at once. With a stop grace
(``opod join``: ``OPOD_STOP_GRACE``), the goodbye goes first instead, and the
engines keep serving the requests in flight until they are idle or the grace
runs out, when those still in flight are cut off by killing the engines (an engine
such as llama-server finishes its answers on SIGTERM); :meth:`Worker.hurry` (a
second Ctrl-C) cuts the wait short.

:class:`WorkerSettings` is plain data: the caller completes it (``opod up`` fills
in its own leader's URL, token and TLS context) before the worker is built.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shlex
import signal
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from opod import __version__, config
from opod.catalog import load_catalog
from opod.contract import env as contract_env
from opod.contract import nodeapi
from opod.contract.wire import WireError
from opod.engines import llama_binary, llama_devices
from opod.engines.errors import LaunchError
from opod.engines.registry import get_driver
from opod.http.serving import Listener, bind, serve
from opod.worker import adoption, builds, declared, identity, inventory, provision
from opod.worker.agent import Agent
from opod.worker.api import WorkerAPI
from opod.worker.engines import EngineManager
from opod.worker.hostload import HostLoadReader
from opod.worker.supervisor import Supervisor
from opod.worker.upgrade import Upgrader

log = logging.getLogger("opod.worker")

IDLE_POLL_S = 0.25
"""How often a stopping worker asks its engines whether requests are still running."""
REEXEC_DELAY_S = 0.2
STOP_SIGNALS = frozenset((signal.SIGINT, signal.SIGTERM))
"""What stops ``opod join``; blocked over a restart as a new process until the new one handles them."""
"""How long a restart as a new process waits after answering, so the answer leaves before the exec."""


class LeaderTLSFiles(TypedDict):
    """``opod join``'s TLS settings as the environment gives them: keyword arguments of :class:`WorkerSettings`."""

    leader_ca: str | None
    client_cert: str | None
    client_key: str | None


@dataclass
class WorkerSettings:
    leader_url: str
    token: str
    home: Path
    listen: tuple[str, int] = ("0.0.0.0", 8081)
    engine: str = "llamacpp"
    threads: int = 0
    node_id: str | None = None
    flags: dict[str, object] = field(default_factory=dict)
    leader_ca: str | None = None
    """``OPOD_LEADER_CA``: the one certificate trusted for an https leader (a path or the PEM)."""
    client_cert: str | None = None
    client_key: str | None = None
    leader_ssl: ssl.SSLContext | None = None
    """A ready TLS context for the leader (``opod up``'s own worker pins the listener's certificate)."""
    stop_grace: float = 0.0
    """Seconds the engines keep serving the requests in flight once told to stop (0: stop at once;
    ``opod up``'s leader waits for them itself, before it stops its worker)."""
    inventory: str | None = None
    """A declared inventory file (``--inventory``, ``OPOD_INVENTORY``): GPUs, MIG instances, labels."""
    reexec: bool = False
    """Restart (and upgrade) as a new process with the engines kept: ``opod join``'s worker, which has its
    process to itself. False: the agent restarts in place (``opod up``'s worker shares the leader's process)."""

    @classmethod
    def tls_from_env(cls) -> LeaderTLSFiles:
        """The TLS settings of ``opod join`` from the environment."""
        cert, key = config.read("OPOD_NODE_CERT"), config.read("OPOD_NODE_KEY")
        if bool(cert) != bool(key):
            raise ValueError("OPOD_NODE_CERT and OPOD_NODE_KEY go together: set both, or neither")
        return {"leader_ca": config.read(contract_env.ENV_LEADER_CA), "client_cert": cert, "client_key": key}


def engine_flags() -> dict[str, object]:
    """``OPOD_ENGINE_FLAGS``: a JSON object of engine flags, or a clear error."""
    text = config.read(contract_env.ENV_ENGINE_FLAGS)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{contract_env.ENV_ENGINE_FLAGS} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f'{contract_env.ENV_ENGINE_FLAGS} must be a JSON object such as {{"ctx": 4096}}')
    return value


def wanted_adapters() -> list[nodeapi.Adapter]:
    """``OPOD_ADAPTERS``: the LoRA adapters attached to every model this worker serves (``[]`` when unset)."""
    text = config.read(contract_env.ENV_ADAPTERS)
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{contract_env.ENV_ADAPTERS} is not JSON: {err}") from None
    example = '[{"name": "support", "source": "/data/adapters/support", "rank": 16}]'
    if not isinstance(value, list):
        raise ValueError(f"{contract_env.ENV_ADAPTERS} must be a JSON list such as {example}")
    adapters = []
    for i, item in enumerate(value):
        try:
            adapter = nodeapi.Adapter.from_wire(json.dumps(item))
        except WireError as err:
            raise ValueError(f"{contract_env.ENV_ADAPTERS}[{i}]: {err}") from None
        if not adapter.name or not adapter.source or ":" in adapter.name:
            raise ValueError(
                f"{contract_env.ENV_ADAPTERS}[{i}]: needs a name (without ':') and a source, as in {example}"
            )
        adapters.append(adapter)
    return adapters


def plan_revision() -> int:
    """``OPOD_PLAN_REVISION``: the plan revision this worker was started for (0 = not stated)."""
    text = config.read(contract_env.ENV_PLAN_REVISION)
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"{contract_env.ENV_PLAN_REVISION}={text!r} must be a whole number (the plan revision)")
    return int(text)


AGENT_LOG_LINES = 2000
"""Lines of the agent's own log kept for ``GET /api/v1/nodes/{id}/logs``."""


class LogRing(logging.Handler):
    """The last lines the worker's loggers wrote, for the leader's logs view."""

    def __init__(self, keep: int = AGENT_LOG_LINES) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # a log line must never break the worker
            pass


def worker_features(manager: EngineManager, *, upgrades: bool = False) -> list[str]:
    """What this worker offers beyond the contract, and what its engine can do (the node view's ``features``);
    ``agent_upgrade`` when it installs and restarts into the release the operator wants."""
    driver = manager.driver
    out = ["logs", "agent_restart", "declared_inventory"] + (["agent_upgrade"] if upgrades else [])
    out += [
        name
        for name, has in (
            ("sleep", driver.can_sleep),
            ("tokenize", driver.can_tokenize),
            ("kv_events", driver.publishes_kv_events),
        )
        if has
    ]
    return out


def take_inventory(settings: WorkerSettings) -> tuple[inventory.Inventory, declared.Declared | None]:
    """The machine, with the declared inventory when one is named; raises ``InventoryError`` naming the field."""
    path = settings.inventory or config.read("OPOD_INVENTORY")
    stated = declared.load(path) if path else None
    return inventory.take(settings.home, stated), stated


class Worker:
    """One worker, built complete by :func:`open_worker`: its engines, their supervisor, its listener and its agent.

    :meth:`run` is the worker's one lifespan: it serves the listener and keeps the
    agent registering and heartbeating until ``stop`` is set, then stops in the
    order the leader needs (engines, then the goodbye heartbeat, then the
    listener), so the leader stops routing here before the port closes.
    """

    def __init__(
        self,
        *,
        settings: WorkerSettings,
        node_id: str,
        supervisor: Supervisor,
        manager: EngineManager,
        listener: Listener,
        agent: Agent,
        book: adoption.EngineBook | None = None,
        handed: adoption.Handed | None = None,
    ) -> None:
        """``book``: the state file a restart as a new process hands the engines over with (None: restarts
        in place); ``handed``: what the previous process handed over, to take back when it runs."""
        self.settings = settings
        self.node_id = node_id
        self.supervisor = supervisor
        self.manager = manager
        self.listener = listener
        self.agent = agent
        self._listener_stop = asyncio.Event()
        self._serving: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._hurry = asyncio.Event()
        self.say: Callable[[str], None] = log.warning
        """Where the stop says what it is doing (``opod join`` prints it)."""
        self.agent_log = LogRing()
        self.book = book
        self.handed = handed
        self.upgrade_warning = ""
        """The upgrade's line among the inventory's warnings ("" = none)."""
        self._reexec: asyncio.Task[None] | None = None

    def log_sources(self) -> list[str]:
        return ["agent", *sorted(self.manager.engines)]

    def log_lines(self, source: str, lines: int) -> list[str] | None:
        """The last ``lines`` of ``source``: ``agent``, or a model this worker runs an engine for."""
        if source == "agent":
            return list(self.agent_log.lines)[-lines:] if lines > 0 else []
        engine = self.manager.engines.get(source)
        if engine is None:
            return None
        process = self.supervisor.get(engine.process_id) if engine.process_id else None
        return process.last_lines(lines) if process is not None else []

    async def restart_agent(self) -> str:
        """Start the agent over: the inventory read again, registered anew; engines and listener untouched.

        Answers why not when the inventory cannot be read now (the agent then goes on as it was).
        """
        try:
            taken, stated = await asyncio.to_thread(take_inventory, self.settings)
        except declared.InventoryError as err:
            return str(err)
        caps = _capabilities(taken, self.manager, self.agent.capabilities.plan_revision, upgrades=self.book is not None)
        self.agent.disk_free_gb = _disk_free(stated, self.manager)
        self.agent.restart(_warned(caps, self.upgrade_warning))
        return ""

    async def restart_process(self, upgrade: str = "") -> str:
        """Restart as a new process, engines kept serving: answers at once ("" or why not now), and
        re-executes a moment later, so the answer reaches the caller first. ``upgrade``: the release
        just installed, for the new process to check it runs it."""
        if self.book is None:
            return "this worker shares its process with the leader; it restarts its agent in place"
        waiting = adoption.fetching(self.manager)
        if waiting:
            return f"weights are being fetched here for {', '.join(waiting)}; restart once their loads have finished"
        if self._reexec is None or self._reexec.done():
            self._reexec = asyncio.get_running_loop().create_task(
                self._exec_soon(upgrade), name="restart as a new process"
            )
        return ""

    async def _exec_soon(self, upgrade: str) -> None:
        await asyncio.sleep(REEXEC_DELAY_S)
        assert self.book is not None
        if self._stopping is not None:
            return  # told to stop meanwhile: the stop wins
        for process_id in self.supervisor.unhanded():
            await self.supervisor.stop(
                process_id
            )  # one the new process could not take back must not outlive the exec unwatched
        handed = self.supervisor.handover()
        # Held across the exec (the mask is inherited), until the new process listens for them: a Ctrl-C that
        # came while it starts, before Python or the loop could take it, would kill it with its engines orphaned.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        self.say(f"restarting as a new process; {len(handed)} engine processes keep running")
        self.supervisor.keep_across_exec(handed)
        self.listener.sock.set_inheritable(True)
        self.book.write(exec_pid=os.getpid(), listener_fd=self.listener.sock.fileno(), upgrade=upgrade)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        argv = [sys.executable, *sys.orig_argv[1:]]
        try:
            os.execv(sys.executable, argv)
        except OSError as err:  # the process goes on as it was: nothing was stopped for the restart
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            log.error("could not restart as a new process (%s): %s", shlex.join(argv), err)
            self.listener.sock.set_inheritable(False)
            self.book.write()

    def set_upgrade_warning(self, text: str) -> None:
        """The upgrade's line in the inventory's warnings ("" = none); the next heartbeat carries it."""
        self.upgrade_warning = text
        self.agent.capabilities = _warned(self.agent.capabilities, text, drop=_upgrade_line)
        self.agent.kick()

    def engine_url(self, model: str) -> str | None:
        """The loopback URL of the engine serving ``model`` here, for a leader in the same process."""
        engine = self.manager.serving(model)
        return engine.base_url if engine is not None else None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and heartbeat until ``stop`` is set (or the leader refuses the token), then stop everything.

        Raises :class:`~opod.worker.agent.TokenRefused` after stopping when the leader refused this worker.
        """
        logging.getLogger("opod.worker").addHandler(self.agent_log)
        if self.handed is not None:
            # Before the listener serves: the requests waiting in its backlog find their engines serving.
            handed, self.handed = self.handed, None
            await adoption.take_back(handed, self.supervisor, self.manager)
            # The leader knows this node: a registration would make it start the node's record afresh and
            # give up its replicas before the first heartbeat lists them again. The first heartbeat brings
            # the new boot id instead (and the inventory, with the release now running); a leader that
            # forgot the node answers it 404, and the agent registers then.
            self.agent.registered.set()
        self._serving = asyncio.create_task(serve([self.listener], self._listener_stop), name="worker listener")
        # Beside registration, not before it: the binary may take seconds to list its devices.
        check = asyncio.create_task(self._check_gpu_use(self.agent.capabilities.gpus or []))
        try:
            await self.agent.run(stop)
        finally:
            check.cancel()
            await self.stop()
            logging.getLogger("opod.worker").removeHandler(self.agent_log)

    async def stop(self) -> None:
        """Stop the engines, say goodbye, close the listener; a second call waits for the first."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    def hurry(self) -> None:
        """Stop at once (a second Ctrl-C): no more waiting for requests in flight, engines killed."""
        self._hurry.set()
        self.supervisor.hurry()

    async def _stop(self) -> None:
        try:
            if self.settings.stop_grace > 0 and not self._hurry.is_set():
                await self.agent.goodbye()  # the leader routes nothing new here; what it sent finishes
                if await self._let_requests_finish(self.settings.stop_grace):
                    self.supervisor.hurry()  # the grace is spent: the answers still running end now
                await self.manager.stop_all()
            else:
                await self.manager.stop_all()
                await self.agent.goodbye()
        finally:
            if self.book is not None:
                self.book.close()  # a normal stop: the engines are stopped, nothing is handed over
            self._listener_stop.set()
            if self._serving is not None:
                await self._serving
            else:
                self.listener.sock.close()

    async def _let_requests_finish(self, grace: float) -> int:
        """Wait until the engines say they are idle (running and queued requests, from their metrics),
        twice in a row, so a request the leader sent just before the goodbye is not cut off either.
        Returns how many are still in flight."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        idle, said, busy = 0, False, 0
        while idle < 2:
            sample, _ = await self.manager.sample()
            # An engine that reports no metrics cannot say it is busy: it is taken as idle. One that has
            # metrics and did not answer this time (a slow scrape) is not: the wait goes on, within the grace.
            unknown = (
                sample is None and self.manager.driver.metrics_path is not None and bool(self.manager.loaded_models())
            )
            busy = 0 if sample is None else (sample.running or 0) + (sample.queue_depth or 0)
            idle = idle + 1 if busy == 0 and not unknown else 0
            if busy and not said:
                said = True
                self.say(
                    f"stopping: {busy} requests in flight on the engines, waiting up to {grace:g} s "
                    "(Ctrl-C again to stop now)"
                )
            remaining = deadline - loop.time()
            if idle >= 2 or remaining <= 0 or self._hurry.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), min(IDLE_POLL_S, remaining))
        if said and busy == 0:
            self.say("stopping: the requests in flight finished")
        elif busy:
            self.say(f"stopping: {busy} requests still in flight are cut off")
        return busy

    async def _check_gpu_use(self, gpus: list[nodeapi.GPU]) -> None:
        """On a machine with GPUs, say when the llama-server this worker starts cannot use them."""
        if not gpus or self.manager.driver.id != "llamacpp":
            return
        try:
            route = llama_binary.resolve()
        except LaunchError:
            return  # the first launch names what is wrong with OPOD_LLAMA_SERVER
        devices = await asyncio.to_thread(llama_devices.list_devices, route.argv)
        warning = llama_devices.unused_gpus_warning(gpus, devices, route.why)
        if warning:
            log.warning("%s", warning)
        elif devices:
            log.info("llama.cpp can use: %s", "; ".join(devices))


def _capabilities(
    taken: inventory.Inventory, manager: EngineManager, revision: int, *, upgrades: bool
) -> nodeapi.Capabilities:
    caps = taken.capabilities(engine=manager.driver.id, plan_revision=revision)
    report = taken.report(manager.driver.id, features=worker_features(manager, upgrades=upgrades))
    return caps.model_copy(update={"inventory": report})


def _upgrade_line(line: str) -> bool:
    return line.startswith(("upgrading to ", "upgrade to "))


def _warned(caps: nodeapi.Capabilities, line: str, drop: Callable[[str], bool] | None = None) -> nodeapi.Capabilities:
    """``caps`` with ``line`` among its inventory's warnings, the lines ``drop`` picks taken out first."""
    report = caps.inventory
    if report is None:
        return caps
    warnings = [w for w in report.warnings or [] if drop is None or not drop(w)] + ([line] if line else [])
    return caps.model_copy(update={"inventory": report.model_copy(update={"warnings": warnings or None})})


def _disk_free(stated: declared.Declared | None, manager: EngineManager) -> Callable[[], int]:
    if stated is not None and stated.disk_free_gb:
        figure = stated.disk_free_gb
        return lambda: figure
    return lambda: inventory.disk_free_gb(manager.home)


def open_worker(settings: WorkerSettings) -> Worker:
    """The one place a worker is built: every part complete before the next that needs it.

    Binds the listener first, so a taken port is refused (``ListenError``) before
    anything starts, and the advertised address carries the real port. Engines and
    processes ask for an early heartbeat through one event that the agent, built
    last because it reports on them, waits on.
    """
    get_driver(settings.engine)  # an unknown engine is refused before anything starts
    taken, stated = take_inventory(settings)  # a bad inventory file is refused before anything starts too
    node_id = settings.node_id or identity.node_id(settings.home)
    host, port = settings.listen
    handed = adoption.read(settings.home) if settings.reexec else None
    sock = adoption.inherited_listener(handed, host, port) or bind(host, port, "the worker")
    try:
        kick = asyncio.Event()
        book = adoption.EngineBook(settings.home, lambda: supervisor, lambda: manager) if settings.reexec else None

        def changed() -> None:
            kick.set()
            if book is not None:
                book.changed()

        chosen = builds.EngineBuilds(settings.home, on_change=lambda: agent.survey_soon())
        supervisor = Supervisor(on_change=lambda _process: changed())
        manager = EngineManager(
            engine_id=settings.engine,
            home=settings.home,
            catalog=load_catalog(),
            supervisor=supervisor,
            threads=settings.threads,
            flags=settings.flags,
            sleep_mode=config.flag(contract_env.ENV_SLEEP_MODE),
            on_change=changed,
            adapters=wanted_adapters(),
            launcher=chosen.launcher,
            died_of_sigill=chosen.died_of_sigill,
        )
        api = WorkerAPI(node_id, settings.token, manager, supervisor, settings.home)
        listener = Listener(api.app(), sock, "worker")
        caps = _capabilities(taken, manager, plan_revision(), upgrades=book is not None)
        agent = Agent(
            leader_url=settings.leader_url,
            node_id=node_id,
            token=settings.token,
            boot_id=identity.boot_id(),
            address=identity.advertise_address(host, listener.port, settings.leader_url),
            capabilities=caps,
            manager=manager,
            leader_ca=settings.leader_ca,
            client_cert=settings.client_cert,
            client_key=settings.client_key,
            ssl_context=settings.leader_ssl,
            kick=kick,
            host_load=HostLoadReader(),
            provision=lambda: provision.survey(len(agent.capabilities.gpus or []), chosen),
            keep_apart=settings.reexec,  # opod join's worker, which has its process to itself
        )
        agent.disk_free_gb = _disk_free(stated, manager)
        agent.on_orders.append(chosen.heard)
    except BaseException:
        sock.close()
        raise
    worker = Worker(
        settings=settings,
        node_id=node_id,
        supervisor=supervisor,
        manager=manager,
        listener=listener,
        agent=agent,
        book=book,
        handed=handed,
    )
    api.log_lines, api.log_sources = worker.log_lines, worker.log_sources
    api.restart_agent = worker.restart_process if book is not None else worker.restart_agent
    if book is not None:
        upgrader = Upgrader(
            running=__version__,
            home=settings.home,
            restart=worker.restart_process,
            warn=worker.set_upgrade_warning,
            installed=handed.upgrade if handed is not None else "",
        )
        agent.on_orders.append(upgrader.heard)
    return worker
