"""The leader reading its directory (``auth.ldap``) on the settings' interval, and at once when that block changes."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opod.access.directory import Directory
from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings

log = logging.getLogger("opod.leader")


class DirectorySyncing:
    """Runs :meth:`Directory.sync` while the leader runs: at start, every ``auth.ldap.sync_interval``, and when the
    ``auth.ldap`` block changes (a new directory is read without waiting a whole interval)."""

    def __init__(self, directory: Directory, settings: SettingsHolder) -> None:
        self._directory = directory
        self._settings = settings
        self._changed = asyncio.Event()
        self._block = settings.current.auth.ldap
        settings.subscribe(self._follow)

    def _follow(self, settings: ClusterSettings) -> None:
        if settings.auth.ldap != self._block:
            self._block = settings.auth.ldap
            self._changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._changed.clear()
            wait: float | None = None
            if self._directory.configured():
                try:
                    done = await self._directory.sync()
                except Exception:  # one bad round must not end the loop
                    log.exception("reading the directory failed")
                else:
                    if done.error:
                        log.warning("LDAP sync: %s", done.error)
                wait = self._settings.current.auth.ldap.sync_seconds
            woken = asyncio.ensure_future(self._changed.wait())
            stopped = asyncio.ensure_future(stop.wait())
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.wait({woken, stopped}, return_when=asyncio.FIRST_COMPLETED), wait)
            finally:
                woken.cancel()
                stopped.cancel()
