"""The worker upgrades itself to the release the operator wants (``POST /api/v1/nodes/{id}/upgrade``).

The leader repeats the wanted release in every heartbeat answer; when it differs
from the release running here, the worker runs the upgrade command once for that
release, in the background: ``OPOD_UPGRADE_COMMAND``, by default
``{python} -m pip install --upgrade opod=={version}``, split as a shell would
split it but run without one, ``{python}`` being this interpreter and
``{version}`` the release. Its output goes to the agent's log and to
``<home>/logs/upgrade.log``. When it succeeds the worker restarts as a new
process with its engines kept serving (:mod:`opod.worker.adoption`), and runs
the new release. While it runs, the node view warns ``upgrading to V``; when it
fails, ``upgrade to V failed: <its last line>``, and the worker goes on with the
release it has. A failed release is not tried again by this process: a new
wanted release, or a restart of the worker, tries again. A restart after an
upgrade that still runs the old release (the command installed it where this
interpreter does not look) says so instead of upgrading again.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from opod.contract import nodeapi
from opod.worker import installs

log = logging.getLogger("opod.worker")

COMMAND_VAR = "OPOD_UPGRADE_COMMAND"
DEFAULT_COMMAND = "{python} -m pip install --upgrade opod=={version}"


def command_for(version: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The upgrade command's argv for ``version``; ValueError naming the variable when it cannot be used."""
    return installs.command(COMMAND_VAR, DEFAULT_COMMAND, {"python": sys.executable, "version": version}, environ)


class Upgrader:
    """Acts on the heartbeat answers' wanted release: one try per release, then a restart into it."""

    def __init__(
        self,
        *,
        running: str,
        home: Path,
        restart: Callable[[str], Awaitable[str]],
        warn: Callable[[str], None],
        installed: str = "",
    ) -> None:
        """``running``: the release this process runs; ``restart(version)``: restart as a new process with the
        engines kept (answers "" or why not); ``warn``: the upgrade's line in the inventory's warnings ("" = none);
        ``installed``: the release an upgrade installed just before this process was started ("" = none)."""
        self.running = running
        self.log_path = home / "logs" / "upgrade.log"
        self._restart = restart
        self._warn = warn
        self._tried: set[str] = set()
        self._task: asyncio.Task[bool] | None = None
        if installed and installed != running:
            self._tried.add(installed)
            self._warn(
                f"upgrade to {installed} failed: it was installed, but the restarted agent still runs {running} "
                "(check where OPOD_UPGRADE_COMMAND installs it)"
            )

    def heard(self, orders: nodeapi.HeartbeatResponse) -> None:
        """One heartbeat answer: start the upgrade when it wants a release not running here and not tried yet."""
        version = orders.wanted_version
        if not version or version == self.running or version in self._tried:
            return
        if self._task is not None and not self._task.done():
            return  # one at a time; the next answer after it ends asks again
        self._tried.add(version)
        self._task = asyncio.get_running_loop().create_task(self.upgrade(version), name=f"upgrade to {version}")

    async def upgrade(self, version: str) -> bool:
        """Run the upgrade command for ``version``, then restart into it; False (and the warning) when it failed."""
        try:
            argv = command_for(version)
        except ValueError as err:
            return self._failed(version, str(err))
        self._warn(f"upgrading to {version}")
        log.info("upgrading to %s: %s", version, shlex.join(argv))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        outcome = await installs.run(argv, label="upgrade", log_file=self.log_path)
        if not outcome.ok:
            return self._failed(version, outcome.last)
        log.info("release %s installed; restarting into it (engines keep serving)", version)
        while problem := await self._restart(version):
            log.info("restarting into %s waits: %s", version, problem)
            await asyncio.sleep(1.0)
        return True

    def _failed(self, version: str, why: str) -> bool:
        log.warning("upgrade to %s failed: %s; going on with %s", version, why, self.running)
        self._warn(f"upgrade to {version} failed: {why[:300]}")
        return False
