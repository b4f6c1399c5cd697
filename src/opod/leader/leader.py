"""The leader's composition root: every object built once, complete, in :meth:`Leader.open`; one lifespan in :meth:`Leader.run`.

Start-up reads the store once (keys, node tokens, nodes, models, placements);
from then on the request path reads memory only, and every change is written
to the store first and to memory in the same moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.routing import Route

from opod import config
from opod.access.guard_attachments import AttachmentTable
from opod.access.guard_service import GuardService, load_guard_attachments
from opod.access.keys import KeyService
from opod.access.people import People
from opod.access.scopes import check_scope
from opod.access.service import AccessService
from opod.access.tenancy import Tenancy, TenancyScopes
from opod.catalog import Catalog, load_catalog
from opod.contract import adminapi
from opod.contract import env as contract_env
from opod.contract.catalog import Entry
from opod.control.app import create_app as create_control_app
from opod.control.areas import public_areas
from opod.control.console.auth import PageAuth
from opod.control.context import ControlContext
from opod.control.serving import ServeJobs
from opod.control.updating import Updates
from opod.control.web.page_auth import SessionPages
from opod.control.web.pages import WebSessions
from opod.fleet.adapters_service import AdaptersService
from opod.fleet.canaries import CanaryBook
from opod.fleet.federation import Federation, cluster_id
from opod.fleet.local import LocalEngines
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.nodes_service import NodesService
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.presets_service import PresetsService
from opod.fleet.quotas_service import QuotasService, load_quotas
from opod.fleet.state import Fleet
from opod.gateway.admission import Admission
from opod.gateway.app import Gateway
from opod.gateway.batches import ClientBatches
from opod.gateway.budgets import Budgets
from opod.gateway.build import ClusterRules, build_gateway
from opod.gateway.files import ClientFiles
from opod.gateway.guardrails import Guardrails
from opod.gateway.usagecount import PromptCounter
from opod.http.fastpath import FastPath
from opod.http.nodeclient import WorkerClient
from opod.http.serving import Listener, serve
from opod.http.tls.server import LeaderTLS
from opod.leader.adminv1.context import AdminContext
from opod.leader.batches import BatchRunner, key_entry, runner_owner
from opod.leader.canary_watch import CanaryWatch
from opod.leader.directory_sync import DirectorySyncing
from opod.leader.draining import drain
from opod.leader.home import make_private
from opod.leader.lifecycle_wiring import build_lifecycle
from opod.leader.nodes import NodeRegistry
from opod.leader.people_wiring import build_people
from opod.leader.public import probe_app, public_app
from opod.leader.reconciler import Reconciler
from opod.leader.replay import Replayer
from opod.leader.startup import DEFAULT_MODELS, load_models, load_nodes, restore_gangs
from opod.leader.webhooks import LifecycleWatch, Webhooks, fan_out
from opod.ledger import Ledger
from opod.security.nodetokens import NodeTokenMinter, load_or_create_secret
from opod.security.sealing import SecretsKey, load_or_create_key
from opod.security.signer import Signer
from opod.settings.holder import SettingsHolder
from opod.settings.service import SettingsService
from opod.shards import Gangs, ShardManager
from opod.snapshots.policy import PolicyView
from opod.snapshots.service import Snapshots
from opod.store import Store
from opod.store.following import Following
from opod.store.offloop import run_sync

log = logging.getLogger("opod.leader")

DEFAULT_ADMISSION = adminapi.PolicyAdmission(hold_ms=30_000, max_held=1024)
"""Without a policy file, a request waits up to 30 s for an engine slot; a mounted policy's admission
block replaces this whole (and there, as the contract says, zero means shed at once)."""


AUTO_PRESETS_EVERY = 10.0
"""Seconds between looks for a preset a node fits, while ``presets.auto`` is on."""

KEY_USE_FLUSH_EVERY = 5.0
"""Seconds between writes of keys' ``last_used_at``: often enough for a listing, rare enough to cost nothing."""

Background = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""Work that runs beside the leader until the stop event is set."""


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    home: Path
    database_url: str | None = None
    require_keys: bool = True
    default_models: bool = True
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """``OPOD_TLS_CERT`` / ``OPOD_TLS_KEY``: serve the public listener over HTTPS (both or neither)."""
    local_node: str | None = None
    """The node id of the worker in this process (``opod up``), which sharded models call ``local``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Leader:
    settings: LeaderSettings
    store: Store
    catalog: Catalog
    boot: int
    access: AccessService
    fleet: Fleet
    models: ModelRegistry
    ledger: Ledger
    workers: WorkerClient
    index: PrefixIndex
    local_engines: LocalEngines
    """Engines of the worker in this process, called directly (``opod up`` attaches its worker)."""
    reconciler: Reconciler
    shards: ShardManager
    snapshots: Snapshots
    """The mounted auth, policy and plan files; started by :meth:`run`."""
    tls: LeaderTLS | None
    """HTTPS for the public listener; None serves plain HTTP."""
    admission: Admission
    prompts: PromptCounter
    """Counts the prompts of streams cut off before the engine's usage, for their usage rows."""
    guardrails: Guardrails
    guard_attachments: AttachmentTable
    """Where the settings' guard policies are attached: read by the gateway per request, written only by the guard
    service (``control.guard``), followed from the store by :meth:`run`."""
    gateway: Gateway
    registry: NodeRegistry
    admin: AdminContext
    control: ControlContext
    new_admin_key: str | None
    """The admin key's plaintext when this start created it: shown once, then forgotten."""
    cluster_settings: SettingsHolder
    webhooks: Webhooks
    """Delivers the operator events to the settings' webhooks; run by :meth:`run`."""
    lifecycle: LifecycleWatch
    """Notices nodes lost and models parked, and emits them."""
    """The cluster's settings in force here: read at open, followed from the store by :meth:`run`."""

    batches: BatchRunner
    """Runs the clients' batches (``/v1/batches``) through the gateway; started by :meth:`run`."""
    serve_jobs: ServeJobs
    """Registry plans and serve jobs; :meth:`run` ends the jobs a stop interrupts."""
    updates: Updates
    """Updates and rollbacks; :meth:`run` takes away the candidates of those a stop left unfinished."""
    client_routes: tuple[Route, ...] = ()
    """``/v1/files`` and ``/v1/batches``, on the public listener."""

    # --- building ----------------------------------------------------------------------

    @classmethod
    def open(cls, settings: LeaderSettings) -> Leader:
        """Build the whole leader from the store (blocking: call it off the event loop).

        Raises ``StoreError``, ``JournalError``, ``TLSConfigError`` or ``ValueError`` saying why it cannot start.
        """
        if (settings.tls_cert is None) != (settings.tls_key is None):
            raise ValueError("OPOD_TLS_CERT and OPOD_TLS_KEY go together: set both to serve HTTPS, or neither")
        make_private(settings.home)
        secrets_key = load_or_create_key(settings.home)
        store = Store.open(settings.database_url, home=settings.home, secrets_key=secrets_key)
        try:
            boot = store.next_boot()
            ledger = Ledger.open(store, settings.home, boot=boot)
        except BaseException:
            store.close()
            raise
        try:
            return cls._assemble(settings, store, boot, ledger, secrets_key)
        except BaseException:
            ledger.close()
            store.close()
            raise

    @classmethod
    def _assemble(
        cls, settings: LeaderSettings, store: Store, boot: int, ledger: Ledger, secrets_key: SecretsKey
    ) -> Leader:
        catalog = load_catalog()
        for problem in catalog.problems:
            log.warning("catalog: %s", problem)
        cluster_settings = SettingsHolder(store, local=config.local_settings())
        cluster_settings.load()
        webhooks = Webhooks(lambda: cluster_settings.current.webhooks, store.get_secret)
        emit = fan_out(ledger.event, webhooks.offer)  # every event to the ledger; the operator ones to the webhooks too
        minter = NodeTokenMinter(load_or_create_secret(settings.home / "node-secret"))
        access = AccessService.load(store, minter)
        # The admin key is this leader's, named as its batch leases name it: its machine and home, kept across restarts.
        new_admin_key = access.ensure_admin_key(settings.home / "admin.key", runner_owner(settings.home))
        people = People.load(
            store, access
        )  # before the first request: a disabled person's keys are refused from the start
        tenancy = Tenancy.load(store, people)
        fleet, models = Fleet(), ModelRegistry()
        load_nodes(store, fleet)
        load_models(store, catalog, models, default_models=settings.default_models)

        def entry_for(model_id: str) -> Entry | None:
            known = models.get(model_id)
            return known.entry if known is not None and known.entry is not None else catalog.get(model_id)

        workers = WorkerClient(access.tokens.token_for_node, Signer)
        index, local_engines = PrefixIndex(), LocalEngines()
        scopes, quota_table = TenancyScopes(tenancy), load_quotas(store)
        # The guard policies' attachments, read whole at start; changed only through `guard` (below, and the
        # followers), read by the gateway.
        guard_attachments = load_guard_attachments(store)
        reconciler = Reconciler(
            fleet, models, workers, housekeeping=index.sweep, quotas=quota_table, scopes=scopes, emit=emit
        )
        quotas = QuotasService(store, quota_table, scopes=scopes, reconciler=reconciler)
        nodes = NodesService(
            store, fleet, workers=workers, bindings=access, prefix_index=index, events=emit, reconciler=reconciler
        )
        federation = Federation.load(store, models, cluster_id(store))
        models_service = ModelsService(
            store,
            models,
            catalog,
            fleet,
            reconciler,
            scopes,
            declared=frozenset(DEFAULT_MODELS) if settings.default_models else frozenset(),
            peers=federation,
        )
        models_service.resolve_stored_owners()
        lifecycle = LifecycleWatch(fleet, reconciler.parked, emit)
        shards = ShardManager(
            Gangs(
                fleet,
                workers,
                entry_for,
                emit=emit,
                local_node=settings.local_node,
                coordinator_node=config.read(contract_env.ENV_COORDINATOR_NODE) or None,
            )
        )
        restore_gangs(store, shards)
        tls_files = (settings.tls_cert, settings.tls_key) if settings.tls_cert and settings.tls_key else None
        snapshots = Snapshots(access, emit, client_certs_verified=tls_files is not None)
        auth_file = snapshots.auth  # read per call: the auth file can change the policy while serving
        tls = LeaderTLS(*tls_files, lambda: auth_file.node_mtls) if tls_files else None
        # Budgets: the settings' prices and budgets, the spend so far read from the usage rows.
        budgets = Budgets(
            settings=cluster_settings, resolve=tenancy.resolve, spent_since=store.usage_spent_since, emit=emit
        )
        budgets.configure()
        cluster_settings.subscribe(budgets.configure)
        canary_book = CanaryBook()
        gateway = build_gateway(
            fleet=fleet,
            models=models,
            keys=access.keys,
            workers=workers,
            index=index,
            local=local_engines,
            usage=ledger,
            policies=snapshots,
            admission=DEFAULT_ADMISSION,
            require_keys=settings.require_keys,
            budgets=budgets,
            rules=ClusterRules(
                settings=cluster_settings,
                tenancy=tenancy,
                bodies=ledger.bodies,
                demand=reconciler.requested,
                federation=federation,
                guard_attachments=guard_attachments,
            ),
            canaries=canary_book,
        )
        admission, prompts, guardrails = gateway.admission, gateway.prompts, gateway.guardrails
        snapshots.policy.subscribe(lambda view: _apply_admission(admission, view))
        registry = NodeRegistry(fleet, access, store, reconciler.kick, emit, index, lambda: auth_file.node_mtls)
        batches = BatchRunner(
            store,
            gateway.serve_as,
            lambda key_id: key_entry(store, access.keys.snapshot_keys, key_id),
            runner_owner(settings.home),
        )
        client_files = ClientFiles(store, gateway.authenticate, lambda: cluster_settings.current.files.project_bytes)
        client_routes = (
            *client_files.routes(),
            *ClientBatches(store, gateway.authenticate, batches.wake, client_files).routes(),
        )
        replayer = Replayer(gateway, access.keys.local_entries)
        lifecycle_parts = build_lifecycle(
            settings.home, store, models, models_service, fleet, reconciler, replayer, canary_book, emit
        )
        admin = AdminContext(
            store=store,
            fleet=fleet,
            models=models,
            workers=workers,
            stats=gateway.stats,
            kick_reconciler=reconciler.kick,
            emit=emit,
            ledger=ledger,
            shards=shards,
            nodes=nodes,
            plan=snapshots.current_plan,
            prefix_index=index.stats,
            tls=tls is not None,
            stopping=lambda: admission.stopping,
            webhook_counts=webhooks.counts,
            cluster=federation.cluster,
        )
        signing_in = build_people(store, cluster_settings, people, tenancy, access, secrets_key)
        keys = KeyService(access, tenancy, cluster_settings)
        guard = GuardService(store, guard_attachments, tenancy=tenancy, keys=keys, settings=cluster_settings)
        control = ControlContext(
            store=store,
            access=access,
            keys=keys,
            people=people,
            members=signing_in.members,
            secrets=signing_in.secrets,
            directory=signing_in.directory,
            federation=federation,
            signin=signing_in.signin,
            permissions=signing_in.permissions,
            tenancy=tenancy,
            fleet=fleet,
            models=models,
            models_service=models_service,
            presets=PresetsService(store, models, catalog, fleet, models_service),
            catalog=catalog,
            reconciler=reconciler,
            events=emit,
            workers=workers,
            settings=cluster_settings,
            settings_service=SettingsService(store, cluster_settings, check_scope),
            budgets=budgets,
            notifier=webhooks,
            nodes=nodes,
            quotas=quotas,
            guard=guard,
            batches=batches,
            replay=replayer,
            oidc=signing_in.oidc,
            stats=gateway.stats,
            serve_jobs=lifecycle_parts.serve_jobs,
            evals=lifecycle_parts.evals,
            canaries=lifecycle_parts.canaries,
            adapters=AdaptersService(models_service, fleet, workers),
            updates=lifecycle_parts.updates,
        )
        return cls(
            batches=batches,
            serve_jobs=lifecycle_parts.serve_jobs,
            updates=lifecycle_parts.updates,
            client_routes=client_routes,
            settings=settings,
            store=store,
            catalog=catalog,
            boot=boot,
            access=access,
            fleet=fleet,
            models=models,
            ledger=ledger,
            workers=workers,
            index=index,
            local_engines=local_engines,
            reconciler=reconciler,
            shards=shards,
            snapshots=snapshots,
            tls=tls,
            admission=admission,
            prompts=prompts,
            guardrails=guardrails,
            guard_attachments=guard_attachments,
            gateway=gateway,
            registry=registry,
            admin=admin,
            control=control,
            new_admin_key=new_admin_key,
            cluster_settings=cluster_settings,
            webhooks=webhooks,
            lifecycle=lifecycle,
        )

    # --- the listeners' apps -------------------------------------------------------------

    def public_app(self, pages: PageAuth | None = None) -> FastPath:
        """``pages``: who is signed in to the members' portal (the sessions' person when not given)."""
        return public_app(
            self.admin,
            self.access.keys,
            self.registry.routes(),
            self.gateway,
            public_areas(self.control, pages or self.pages()),
            client_routes=self.client_routes,
        )

    def admin_app(self) -> FastAPI:
        return create_control_app(self.control, self.pages())

    def pages(self) -> PageAuth:
        """Who is signed in to the console and the portal: the person of a request's session."""
        return SessionPages(WebSessions(self.control.signin.sessions))

    def probe_app(self) -> Starlette:
        return probe_app(self.admin)

    def wait_ready(self) -> bool:
        return bool(self.fleet.served_models())

    # --- the lifespan ------------------------------------------------------------------------

    async def run(
        self,
        listeners: Sequence[Listener],
        stop: asyncio.Event,
        *,
        drain: Callable[[bool], Awaitable[None]] | None = None,
        beside: Sequence[Background] = (),
        grace: float = 0.0,
        hurry: asyncio.Event | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        """Serve until ``stop`` is set, then stop everything in order; ends with the store closed.

        Start: the mounted files (applied before the first request), the ledger's writer, the
        reconciler, the healer, the key-use flush, ``beside``, the listeners. Stop: no new request
        is taken (:meth:`let_requests_finish`: those in flight get up to ``grace`` seconds, cut
        short when ``hurry`` is set), then ``drain`` (the local worker's engines and its last
        heartbeat, which still needs the listeners; told ``True`` when requests are still in flight,
        to cut them now rather than after the engines' own stop), the background work, the listeners,
        the ledger's last rows, the files' watchers, then :meth:`close`.
        """
        try:
            await self.snapshots.start()
        except BaseException:
            await self.close()
            raise
        ledger_stop, listeners_stop = asyncio.Event(), asyncio.Event()
        writer = asyncio.create_task(self.ledger.run(ledger_stop), name="ledger writer")
        work: list[Background] = [
            self.batches.run,
            self.serve_jobs.run,
            self.reconciler.run,
            self.shards.run_healer,
            self._flush_key_uses,
            self._auto_presets,
            self.webhooks.run,
            self.lifecycle.run,
            self.control.evals.run,
            self.updates.run,
            *beside,
        ]
        work += [self.following().run, self.control.signin.sessions.run]
        work.append(DirectorySyncing(self.control.directory, self.cluster_settings).run)  # auth.ldap's directory read
        work.append(self.control.federation.run)  # the federation's peers checked
        work.append(CanaryWatch(self.control.canaries, self.control.canaries.book, self.models).run)
        background = [asyncio.create_task(run(stop)) for run in work]
        serving = asyncio.create_task(serve(list(listeners), listeners_stop), name="listeners")
        try:
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
        finally:
            stop.set()
            left = await self.let_requests_finish(0.0 if serving.done() else grace, hurry, say or log.info)
            if drain is not None:
                try:
                    await drain(left > 0)
                except Exception:  # the rest must still stop, and the store close
                    log.exception("stopping the local worker failed")
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.registry.close()
            listeners_stop.set()
            failure: Exception | None = None
            try:
                await serving
            except Exception as err:  # raised once the rest has stopped cleanly
                failure = err
            await self.prompts.settle()  # the rows of streams cut off at the end wait for their prompt counts
            ledger_stop.set()  # after the listeners: the last answers' rows are written before the leader exits
            await writer
            await self.snapshots.stop()
            await self.close()
            if failure is not None:
                raise failure

    def following(self) -> Following:
        """What other leaders of the same store change (settings, people, keys, the tenancy tree, quotas, guard
        attachments, new batches) in force here within 2 s; read only when the store has changed since."""
        following = Following(self.store)
        following.add("the settings", self.cluster_settings.follow)
        following.add("people", self.control.people.follow)
        following.add("keys", self.access.follow)
        following.add("the tenancy tree", self.control.tenancy.follow)
        following.add("quotas", self.control.quotas.follow)
        following.add("guard attachments", self.control.guard.follow)
        following.add("the batches left", self.batches.follow)
        return following

    @property
    def stopping(self) -> bool:
        """True once the leader has begun to stop: ``/readyz`` answers not ready, ``/v1`` requests 503."""
        return self.admission.stopping

    async def let_requests_finish(self, grace: float, hurry: asyncio.Event | None, say: Callable[[str], None]) -> int:
        """Take no new request and give those in flight up to ``grace`` seconds (:func:`opod.leader.draining.drain`);
        how many are still in flight, to be cut off."""
        return await drain(self.admission, grace, hurry, say)

    async def _flush_key_uses(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), KEY_USE_FLUSH_EVERY)
            await self.access.flush_key_uses()

    async def _auto_presets(self, stop: asyncio.Event) -> None:
        """Add the presets a node fits while ``presets.auto`` is on (off by default)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), AUTO_PRESETS_EVERY)
            if stop.is_set():
                return
            try:
                await self.control.presets.auto_add()
            except Exception:  # one bad round must not stop the loop
                log.exception("adding presets by themselves failed")

    async def close(self) -> None:
        """Release what the leader holds: the guardrails' connections, the tokenize calls in flight, the
        workers' connections, the last key uses, the ledger, the store."""
        await self.guardrails.close()
        await self.gateway.prefix.close()
        if self.gateway.templates is not None:
            await self.gateway.templates.close()
        await self.prompts.settle()
        await self.workers.close()
        await self.access.flush_key_uses()
        await self.ledger.flush()
        self.ledger.close()
        await run_sync(self.store.close)


def _apply_admission(admission: Admission, view: PolicyView) -> None:
    """A policy's admission block replaces opod's default whole; an empty block means "as before": the default."""
    block = view.snapshot.admission
    admission.configure(block if block.to_wire() else DEFAULT_ADMISSION)
