"""Running a door: the routes file loaded and watched, the proxy on one listener.

A door refuses to start without a good routes file (it would have nothing to
route); once running, a bad new version is refused and the last good one stays.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from opod.door.app import Door
from opod.door.routes import DoorRoutesFile
from opod.fleet.followers import EventSink
from opod.http.serving import Listener, bind, serve
from opod.snapshots.watch import POLL_INTERVAL, FileWatcher, no_events


class DoorError(RuntimeError):
    """The door cannot start; the message says why and what to do."""


class DoorServer:
    def __init__(
        self,
        routes_path: Path,
        listen: tuple[str, int],
        emit: EventSink = no_events,
        *,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.routes_path = Path(routes_path)
        self.listen = listen
        self.routes = DoorRoutesFile()
        self.door = Door(self.routes)
        self.watcher = FileWatcher(self.routes_path, self.routes, emit, interval=interval)
        self.listener: Listener | None = None

    async def start(self) -> None:
        """Load the routes file (or raise :class:`DoorError`), bind the listener, start watching."""
        if not self.routes_path.is_file():
            raise DoorError(
                f"the routes file {self.routes_path} does not exist; write it first "
                f'(e.g. {{"revision": "1", "routes": [{{"alias": "chat", "upstream": "http://leader:8080"}}]}})'
            )
        await self.watcher.start()
        if self.routes.table() is None:
            await self.watcher.stop()
            raise DoorError(f"the routes file {self.routes_path} was refused: {self.watcher.last_error}")
        try:
            self.listener = Listener(self.door.app(), bind(*self.listen, "the door"), "door")
        except OSError:
            await self.watcher.stop()
            raise

    @property
    def port(self) -> int:
        assert self.listener is not None
        return self.listener.port

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then close the listener, the watcher and the upstream connections."""
        assert self.listener is not None, "start() first"
        try:
            await serve([self.listener], stop)
        finally:
            await self.watcher.stop()
            await self.door.close()
