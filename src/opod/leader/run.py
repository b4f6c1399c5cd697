"""``opod up``'s lifecycle: open the leader, listen, run the local worker, say what is happening, stop cleanly.

On Ctrl-C the engines stop first, the local worker sends its final "stopped"
heartbeat, and only then do the listeners close.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from opod.http.serving import Listener, bind, serve, settle_memory
from opod.leader.leader import Leader, LeaderSettings
from opod.leader.tls import enable_leader_tls
from opod.worker.run import Worker, WorkerSettings

log = logging.getLogger("opod.leader")


@dataclass
class UpSettings:
    leader: LeaderSettings
    listen: tuple[str, int] = ("0.0.0.0", 8080)
    admin_listen: tuple[str, int] = ("127.0.0.1", 9090)
    probe_listen: tuple[str, int] | None = None
    """A plain listener serving only the probes (``OPOD_PROBE_LISTEN``)."""
    tls_cert: str | None = None
    tls_key: str | None = None
    """``OPOD_TLS_CERT`` / ``OPOD_TLS_KEY``: serve the public listener over HTTPS."""
    worker: WorkerSettings | None = None
    """The local worker; ``leader_url`` and ``token`` are filled in here."""


class Up:
    def __init__(self, settings: UpSettings, say: Callable[[str], None]) -> None:
        self.settings = settings
        self.say = say
        self.leader: Leader | None = None
        self.worker: Worker | None = None
        self.listeners: list[Listener] = []
        self.stop = asyncio.Event()

    async def start(self) -> None:
        s = self.settings
        self.leader = await asyncio.to_thread(Leader.open, s.leader)
        await self.leader.start_snapshots()
        tls = await enable_leader_tls(self.leader, s.tls_cert, s.tls_key) if s.tls_cert and s.tls_key else None
        self.leader.tls = tls
        public = Listener(self.leader.public_app(), bind(*s.listen, "the leader"), "public", ssl=tls.context if tls else None)
        admin = Listener(self.leader.admin_app(), bind(*s.admin_listen, "the admin listener"), "admin")
        self.listeners = [public, admin]
        if s.probe_listen is not None:
            self.listeners.append(Listener(self.leader.probe_app(), bind(*s.probe_listen, "the probe listener"), "probe"))
        if s.worker is not None:
            s.worker.leader_url = f"{public.scheme}://127.0.0.1:{public.port}"
            if tls is not None:
                s.worker.leader_ssl = tls.local_worker_context()
            s.worker.token = await asyncio.to_thread(self.leader.local_worker_token)
            self.worker = Worker(s.worker)
            self.listeners.append(self.worker.bind())
            manager = self.worker.manager

            def engine_url(model: str) -> str | None:
                engine = manager.serving(model)
                return engine.base_url if engine is not None else None

            assert self.leader.gateway is not None
            self.leader.gateway.relay.local[self.worker.node_id] = engine_url
            if self.leader.shards is not None:
                self.leader.shards.local_node = self.worker.node_id

    async def run(self) -> None:
        assert self.leader is not None and self.leader.reconciler is not None
        settle_memory()
        servers_stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        serving = asyncio.create_task(serve(self.listeners, servers_stop))
        ledger_stop = asyncio.Event()
        writer = asyncio.create_task(self.leader.ledger.run(ledger_stop))
        tasks = [asyncio.create_task(self.leader.reconciler.run(self.stop)), asyncio.create_task(self._report())]
        if self.leader.shards is not None:
            tasks.append(asyncio.create_task(self.leader.shards.run_healer(self.stop)))
        if self.worker is not None:
            tasks.append(asyncio.create_task(self._run_worker()))
        await self.stop.wait()
        self.say("stopping: engines first, then the listeners")
        if self.worker is not None:
            await self.worker.shutdown()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        servers_stop.set()
        await serving
        ledger_stop.set()  # after the listeners: the last answers' rows are written before the leader exits
        await writer
        await self.leader.stop_snapshots()
        await self.leader.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        self.say("stopped")

    async def _run_worker(self) -> None:
        assert self.worker is not None
        try:
            await self.worker.run(self.stop)
        except Exception as err:
            self.say(f"the local worker stopped: {err}")

    async def _report(self) -> None:
        """Say when a wanted model starts loading, fails, or is served — once per change."""
        assert self.leader is not None and self.leader.reconciler is not None
        said: dict[str, str] = {}
        while not self.stop.is_set():
            for model in self.leader.models:
                if model.removed or not model.wants_loaded():
                    continue
                status = self.leader.reconciler.status(model.id)
                line = f"{model.id}: {status}"
                if said.get(model.id) != line:
                    said[model.id] = line
                    self.say(line)
            await asyncio.sleep(0.5)
