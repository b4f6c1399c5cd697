"""``opod up``: open the leader, bind its listeners, attach the local worker, say what is happening, stop cleanly.

The leader's own lifespan (:meth:`opod.leader.leader.Leader.run`) starts and
stops everything in order. On SIGTERM or Ctrl-C the leader first stops taking
requests (``/v1`` answers 503 with ``Retry-After``) and lets those in flight
finish, for up to the stop grace (``OPOD_STOP_GRACE``, 30 s by default), and
those still running when it ends are cut off then; the local worker's engines
stop and it sends its final "stopped" heartbeat, and only then do the listeners
close. A second signal cuts the wait short and kills
the engines at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from opod import config
from opod.http import cpu
from opod.http.serving import Listener, bind, settle_memory
from opod.leader.leader import Leader, LeaderSettings
from opod.store.offloop import run_sync
from opod.worker import identity
from opod.worker.run import Worker, WorkerSettings, open_worker

log = logging.getLogger("opod.leader")


@dataclass
class UpSettings:
    leader: LeaderSettings
    listen: tuple[str, int] = ("0.0.0.0", 8080)
    admin_listen: tuple[str, int] = ("127.0.0.1", 9090)
    probe_listen: tuple[str, int] | None = None
    """A plain listener serving only the probes (``OPOD_PROBE_LISTEN``)."""
    worker: WorkerSettings | None = None
    """The local worker; ``leader_url``, ``token`` and ``leader_ssl`` are filled in by :meth:`Up.start`."""
    stop_grace: float | None = None
    """Seconds requests in flight may take to finish once told to stop; ``None`` reads ``OPOD_STOP_GRACE`` (30 s)."""


@dataclass(frozen=True, slots=True)
class Started:
    leader: Leader
    listeners: list[Listener]
    """The public listener first, then the admin listener, then the probe listener if any."""
    worker: Worker | None
    """The local worker (it serves its own listener)."""


class Up:
    def __init__(self, settings: UpSettings, say: Callable[[str], None]) -> None:
        self.settings = settings
        self.say = say
        self.stop = asyncio.Event()
        """Set by the first SIGTERM or Ctrl-C: stop taking requests, let those in flight finish."""
        self.hurry = asyncio.Event()
        """Set by the second: stop at once."""
        self.grace = config.DEFAULT_STOP_GRACE if settings.stop_grace is None else settings.stop_grace
        """Read from ``OPOD_STOP_GRACE`` by :meth:`start` when the settings do not say."""
        self._worker_stop = asyncio.Event()
        """The local worker's own stop, set only once the requests in flight are done with its engines."""
        self._started: Started | None = None

    @property
    def started(self) -> Started:
        if self._started is None:
            raise RuntimeError("opod up has not started: call Up.start() first")
        return self._started

    @property
    def leader(self) -> Leader:
        return self.started.leader

    @property
    def listeners(self) -> list[Listener]:
        return self.started.listeners

    @property
    def worker(self) -> Worker | None:
        return self.started.worker

    async def start(self) -> None:
        """Build the leader and bind its listeners (nothing is served until :meth:`run`)."""
        asyncio.get_running_loop().set_default_executor(cpu.executor())  # its threads leave the loop's CPU once pinned
        s = self.settings
        if s.stop_grace is None:
            self.grace = config.stop_grace()  # a bad value is refused (ValueError) before anything starts
        leader_settings = s.leader
        if s.worker is not None:
            local_node = s.worker.node_id or identity.node_id(s.worker.home)
            leader_settings = dataclasses.replace(leader_settings, local_node=local_node)
        leader = await run_sync(Leader.open, leader_settings)
        try:
            self._started = await self._bind(leader)
        except BaseException:
            await leader.close()
            raise

    async def _bind(self, leader: Leader) -> Started:
        s = self.settings
        tls = leader.tls
        public = Listener(
            leader.public_app(), bind(*s.listen, "the leader"), "public", ssl=tls.context if tls else None
        )
        admin = Listener(
            leader.admin_app(),
            bind(*s.admin_listen, "the admin listener", option="--admin-listen (or OPOD_ADMIN_LISTEN)"),
            "admin",
        )
        listeners = [public, admin]
        if s.probe_listen is not None:
            listeners.append(
                Listener(
                    leader.probe_app(), bind(*s.probe_listen, "the probe listener", option="OPOD_PROBE_LISTEN"), "probe"
                )
            )
        if s.worker is None:
            return Started(leader, listeners, None)
        s.worker.leader_url = f"{public.scheme}://127.0.0.1:{public.port}"
        if tls is not None:
            s.worker.leader_ssl = tls.local_worker_context()
        s.worker.token = await run_sync(leader.access.local_worker_token)
        worker = open_worker(s.worker)
        leader.local_engines.attach(worker.node_id, worker.engine_url)
        return Started(leader, listeners, worker)

    async def run(self) -> None:
        """Serve until the first SIGTERM or Ctrl-C has stopped everything (:meth:`signalled`)."""
        settle_memory()
        loop = asyncio.get_running_loop()
        await cpu.pin_event_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.signalled)
        try:
            await self.serve()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        self.say("stopped")

    async def serve(self) -> None:
        """The leader's lifespan with the local worker beside it, until :attr:`stop` is set (by a signal under
        :meth:`run`, or by whoever runs this)."""
        started = self.started
        beside = [self._report] + ([self._run_worker] if started.worker is not None else [])
        await started.leader.run(
            started.listeners,
            self.stop,
            drain=self._drain,
            beside=beside,
            grace=self.grace,
            hurry=self.hurry,
            say=self.say,
        )

    def signalled(self) -> None:
        """SIGTERM or Ctrl-C: the first stops gracefully, the next stops at once."""
        if not self.stop.is_set():
            self.stop.set()
            return
        if not self.hurry.is_set():
            self.say("stopping now: the requests in flight are cut off and the engines killed")
            self.hurry.set()
            worker = self._started.worker if self._started is not None else None
            if worker is not None:
                worker.hurry()

    async def _drain(self, cut: bool) -> None:
        """Stop the local worker; ``cut``: the grace is spent with requests in flight, so its engines are
        killed now, not given the seconds of their own stop (llama-server finishes an answer on SIGTERM)."""
        worker = self.started.worker
        if worker is not None:
            self.say("stopping: the engines, then the listeners")
            if cut:
                worker.hurry()
            self._worker_stop.set()
            await worker.stop()

    async def _run_worker(self, stop: asyncio.Event) -> None:
        # The worker runs to its own stop, not the leader's: its engines serve the requests in flight.
        worker = self.started.worker
        if worker is None:
            return
        try:
            await worker.run(self._worker_stop)
        except Exception as err:
            self.say(f"the local worker stopped: {err}")

    async def _report(self, stop: asyncio.Event) -> None:
        """Say when a wanted model starts loading, fails, or is served — once per change. With a local worker,
        nothing until a reconciler round has seen it registered: before, every model "cannot be placed"."""
        leader = self.started.leader
        worker = self.started.worker
        said: dict[str, str] = {}
        seen_at: int | None = None
        """The reconciler's round count when the local worker was first heard; ``None`` until then."""
        while not stop.is_set():
            if worker is not None and (seen_at is None or leader.reconciler.rounds <= seen_at):
                node = leader.fleet.get(worker.node_id)
                if seen_at is None and node is not None and node.last_heartbeat > 0:
                    seen_at = leader.reconciler.rounds
                await asyncio.sleep(0.1)
                continue
            for model in leader.models:
                if model.removed or not model.wants_loaded():
                    continue
                line = f"{model.id}: {leader.reconciler.status(model.id)}"
                if said.get(model.id) != line:
                    said[model.id] = line
                    self.say(line)
            await asyncio.sleep(0.5)
