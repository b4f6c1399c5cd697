"""The three mounted files of a leader, wired together: one object for the lead to start and stop.

The policy's ``auth.maxSnapshotAgeSec`` is handed to the access service as each
policy applies, so the staleness bound and the keys it guards live side by side.
The gateway reads the policy and the plan through :meth:`Snapshots.current_policy`
and :meth:`Snapshots.current_plan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opod.access.service import AccessService
from opod.contract import env as contract_env
from opod.contract.adminapi import PlanSnapshot
from opod.fleet.followers import EventSink
from opod.snapshots.auth import AuthFile
from opod.snapshots.plan import PlanFile
from opod.snapshots.policy import PolicyFile, PolicyView
from opod.snapshots.watch import (
    DEFAULT_AUTH_FILE,
    DEFAULT_PLAN_FILE,
    DEFAULT_POLICY_FILE,
    POLL_INTERVAL,
    FileWatcher,
    no_events,
    resolve,
)


@dataclass(frozen=True, slots=True)
class SnapshotPaths:
    """Which files to watch; None = no watcher for that kind."""

    auth: Path | None = None
    policy: Path | None = None
    plan: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SnapshotPaths:
        """CONTRACT.md §3: the variable's path, ``off`` = none, unset = the default path.

        The default auth and policy paths are watched even when absent (a manager may
        mount them later); the default plan path only when it exists now.
        """
        env = dict(environ) if environ is not None else None
        return cls(
            auth=resolve(contract_env.ENV_AUTH_FILE, DEFAULT_AUTH_FILE, environ=env),
            policy=resolve(contract_env.ENV_POLICY_FILE, DEFAULT_POLICY_FILE, environ=env),
            plan=resolve(contract_env.ENV_PLAN_FILE, DEFAULT_PLAN_FILE, only_if_present=True, environ=env),
        )


class Snapshots:
    """The auth, policy and plan files of one leader.

    Built unstarted (so the gateway can be given it); :meth:`start` applies the files and
    watches them. Readers: :meth:`current_policy`, :meth:`current_plan`, ``auth.node_mtls``,
    ``policy.subscribe``. ``client_certs_verified`` says the public listener serves TLS,
    so worker certificates can be checked (and ``nodeMtls: require`` is accepted).
    """

    def __init__(
        self,
        access: AccessService,
        emit: EventSink = no_events,
        *,
        paths: SnapshotPaths | None = None,
        client_certs_verified: bool = False,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.access = access
        self.paths = paths if paths is not None else SnapshotPaths.from_env()
        self.auth = AuthFile(access, client_certs_verified=client_certs_verified)
        self.policy = PolicyFile()
        self.plan = PlanFile()
        self.policy.subscribe(self._policy_applied)
        self.watchers: list[FileWatcher[Any]] = []
        for path, applier in (
            (self.paths.auth, self.auth),
            (self.paths.policy, self.policy),
            (self.paths.plan, self.plan),
        ):
            if path is not None:
                self.watchers.append(FileWatcher(path, applier, emit, interval=interval))

    def _policy_applied(self, view: PolicyView) -> None:
        self.access.set_max_snapshot_age(view.max_snapshot_age_sec)

    def current_policy(self) -> PolicyView | None:
        """The mounted policy's view, or None while no policy file is applied (opod's own defaults hold)."""
        return self.policy.applied

    def current_plan(self) -> PlanSnapshot | None:
        """The mounted plan, or None: with a plan only its model is served."""
        return self.plan.current()

    async def start(self) -> None:
        """Apply the files present now (policy before auth, so a stale bound holds from the first request), then watch."""
        order = {"policy": 0, "auth": 1, "plan": 2}
        for watcher in sorted(self.watchers, key=lambda w: order[w.applier.kind]):
            await watcher.start()

    async def stop(self) -> None:
        for watcher in self.watchers:
            await watcher.stop()

    def status(self) -> dict[str, Any]:
        """Per file: path, revision held, why the newest version is not held; plus the auth snapshot's age."""
        out: dict[str, Any] = {}
        for watcher in self.watchers:
            out[watcher.applier.kind] = {
                "path": str(watcher.path),
                "revision": watcher.applier.revision,
                "error": watcher.last_error,
            }
        age = self.access.keys.snapshot_age_sec()
        out["auth_snapshot_age_sec"] = None if age is None else int(age)
        out["node_mtls"] = self.auth.node_mtls.describe()
        return out
