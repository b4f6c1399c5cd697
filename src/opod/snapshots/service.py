"""The three mounted files of a leader, wired together: one object for the lead to start and stop.

The policy's ``auth.maxSnapshotAgeSec`` is handed to the key table as each
policy applies, so the staleness bound and the keys it guards live side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opod.access.keytable import KeyTable
from opod.contract import env as contract_env
from opod.snapshots.auth import (
    REQUIRE_WITHOUT_TLS,
    AddTombstones,
    AuthFile,
    LoadTombstones,
)
from opod.snapshots.plan import PlanFile
from opod.snapshots.policy import PolicyFile, PolicyView
from opod.snapshots.watch import (
    DEFAULT_AUTH_FILE,
    DEFAULT_PLAN_FILE,
    DEFAULT_POLICY_FILE,
    POLL_INTERVAL,
    Emit,
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

    Readers: ``keys`` (the gateway's key table, fed by the auth file),
    ``policy.view()`` / ``policy.current()``, ``plan.current()`` / ``plan.check_model()``,
    ``auth.node_mtls``.
    """

    def __init__(self, keys: KeyTable, emit: Emit = no_events, *, paths: SnapshotPaths | None = None,
                 load_tombstones: LoadTombstones | None = None, add_tombstones: AddTombstones | None = None,
                 client_certs_verified: bool = False, interval: float = POLL_INTERVAL) -> None:
        self.keys = keys
        self.paths = paths if paths is not None else SnapshotPaths.from_env()
        self.auth = AuthFile(keys, load_tombstones=load_tombstones, add_tombstones=add_tombstones,
                             client_certs_verified=client_certs_verified)
        self.policy = PolicyFile()
        self.plan = PlanFile()
        self.policy.subscribe(self._policy_applied)
        self.watchers: list[FileWatcher[Any]] = []
        self._emit = emit
        self._interval = interval
        self._started = False
        for path, applier in ((self.paths.auth, self.auth), (self.paths.policy, self.policy), (self.paths.plan, self.plan)):
            if path is not None:
                self.watchers.append(FileWatcher(path, applier, emit, interval=interval))

    def _policy_applied(self, view: PolicyView) -> None:
        self.keys.max_snapshot_age_sec = view.max_snapshot_age_sec

    async def start(self) -> None:
        """Apply the files present now (policy before auth, so a stale bound holds from the first request), then watch."""
        self._started = True
        order = {"policy": 0, "auth": 1, "plan": 2}
        for watcher in sorted(self.watchers, key=lambda w: order[w.applier.kind]):
            await watcher.start()

    async def stop(self) -> None:
        self._started = False
        for watcher in self.watchers:
            await watcher.stop()

    async def verify_client_certs(self) -> None:
        """The leader's TLS listener now checks worker certificates (``opod.leader.tls.enable_leader_tls``).

        The held ``nodeMtls`` becomes enforced. An auth file refused before because it said
        ``require`` is judged again: a new watcher on the same path reads it afresh.
        """
        self.auth.verify_client_certs()
        for i, watcher in enumerate(self.watchers):
            refused_for_tls = (watcher.last_error or "").startswith(REQUIRE_WITHOUT_TLS)
            if watcher.applier is self.auth and self._started and refused_for_tls:
                await watcher.stop()
                fresh: FileWatcher[Any] = FileWatcher(watcher.path, self.auth, self._emit, interval=self._interval)
                self.watchers[i] = fresh
                await fresh.start()

    def status(self) -> dict[str, Any]:
        """Per file: path, revision held, why the newest version is not held; plus the auth snapshot's age."""
        out: dict[str, Any] = {}
        for watcher in self.watchers:
            out[watcher.applier.kind] = {"path": str(watcher.path), "revision": watcher.applier.revision, "error": watcher.last_error}
        age = self.keys.snapshot_age_sec()
        out["auth_snapshot_age_sec"] = None if age is None else int(age)
        out["node_mtls"] = self.auth.node_mtls.describe()
        return out
