"""What the management API works on: the store and the leader's in-memory state, shared with the gateway."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from opod.access.directory import Directory
from opod.access.guard_service import GuardService
from opod.access.keys import KeyService
from opod.access.members import Memberships
from opod.access.oidc import OidcSignIn
from opod.access.people import People
from opod.access.permissions import Permissions
from opod.access.secrets import AuthSecrets
from opod.access.service import AccessService
from opod.access.signin import SignIn
from opod.access.tenancy import Tenancy
from opod.catalog import Catalog
from opod.contract.admin.models import (
    ModelserveChange,
    ModelserveJob,
    ModelservePlan,
    ModelserveRequest,
    ModelserveUpdateInfo,
    OriginView,
)
from opod.control.evals.service import EvalsService
from opod.fleet.adapters_service import AdaptersService
from opod.fleet.canaries_service import CanariesService
from opod.fleet.federation import Federation
from opod.fleet.followers import EventSink, Reconciling
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.nodes_service import NodesService
from opod.fleet.placed import Rejection
from opod.fleet.presets_service import PresetsService
from opod.fleet.quotas_service import QuotasService
from opod.fleet.state import Fleet
from opod.gateway.budgets import Budgets
from opod.gateway.stats import GatewayStats
from opod.http.nodeclient import WorkerClient
from opod.settings.holder import SettingsHolder
from opod.settings.service import SettingsService
from opod.store import Store
from opod.store.audit import AuditDraft


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlContext:
    """Everything the management API's areas work with, each field always there: built once, in ``Leader.open``.

    No area takes the whole: the list of areas (:mod:`opod.control.areas`) hands each one the
    fields it uses, so an area's signature says what it reads and what it changes.
    """

    store: Store
    """Synchronous: called through :func:`opod.store.offloop.run_sync`."""
    access: AccessService
    """The one writer of keys and node tokens."""
    keys: KeyService
    """Keys and node tokens as ``/keys`` and ``/node-tokens`` issue them: owners, traits and lifetimes checked."""
    people: People
    """People and their memberships (``/users``, SCIM): the one writer."""
    members: Memberships
    """Memberships as ``/users`` changes them: a person put in a place, or taken out with the keys they lose."""
    secrets: AuthSecrets
    """The sign-in secrets (``/auth/secrets``) and SCIM's bearer token."""
    directory: Directory
    """Sign-in checked by ``auth.ldap``'s directory, its sync and its view (``/auth``, ``/auth/ldap/test``)."""
    federation: Federation
    """Other opod clusters whose models are offered here as PEER/MODEL (``/federation``)."""
    signin: SignIn
    """Sign-in, sign-up, sessions and local accounts (the web's pages, ``/accounts``, sessions on ``/api/v1``)."""
    permissions: Permissions
    """What a signed-in person may do, by role and membership."""
    tenancy: Tenancy
    """Organizations, teams and projects in memory (``/orgs``, ``/teams``, ``/projects``, keys' owners): the one writer."""
    fleet: Fleet
    models: ModelRegistry
    models_service: ModelsService
    """The one writer of the models: definitions, scaling, class, owner, resources, pins, capacity measurements."""
    presets: PresetsService
    """The presets offered, the ``presets.auto`` switch, adding one."""
    catalog: Catalog
    """The bundled catalog and the operator's own entries: what a model added by name is."""
    reconciler: ReplicaDesk
    """The reconciler: replicas, restarts, model states; woken after a change that moves placement."""
    events: EventSink
    """Lifecycle events: to the ledger's event stream, and the operator ones to the webhooks."""
    workers: WorkerClient
    """Signed calls to workers (weights)."""
    settings: SettingsHolder
    """The cluster's settings in force on this leader (key rules, prices, Prometheus)."""
    settings_service: SettingsService
    """The one writer of the cluster's settings (``/settings``: put and rollback)."""
    budgets: Budgets
    """The budgets the gateway enforces: which scope sets one (``/usage``)."""
    notifier: Notifier
    """The webhooks of the cluster's settings (``POST /notify/test``)."""
    nodes: NodesService
    """The operator's side of nodes (state, labels, engine builds, the wanted release, forgetting): the one writer."""
    quotas: QuotasService
    """Capacity quotas (``/quotas``): the one writer, and what each scope holds."""
    guard: GuardService
    """Where the settings' guard policies are attached (``/guard``): the one writer, and what the guards did."""
    batches: JobWaker
    """The batch runner, told to look at its jobs now after a cancel."""
    replay: Replayer
    """A kept request sent again through the gateway as the operator's own request (``POST /requests/{id}/replay``)."""
    oidc: OidcSignIn
    """Sign-in through the settings' OpenID provider (``auth.oidc``): the flow the portal's sign-in pages drive."""
    stats: GatewayStats
    """The gateway's own counters (requests and errors in the last minute): the console's summary."""
    serve_jobs: Serving
    """Registry plans and serve jobs (``/plan``, ``/models/serve``, ``/jobs``)."""
    evals: EvalsService
    """Quality suites and runs (``/eval``, ``/models/{name}/eval``) and each model's eval gate: the one writer of runs."""
    canaries: CanariesService
    """Models' canaries (``/models/{name}/canary``, ``/canaries``, ``promote``): the one writer."""
    adapters: AdaptersService
    """Models' LoRA adapters (``/models/{name}/adapters``): read on the workers, judged, kept, attached."""
    updates: Updating
    """Newer weights for served models, updates held to quality, rollbacks, origins (``/updates``, ``update``...)."""


class JobWaker(Protocol):
    """The batch runner (``opod.leader.batches.BatchRunner``) as control sees it."""

    def wake(self) -> None:
        """Look at the jobs now (one was cancelled) rather than at the next round."""
        ...


class Replayer(Protocol):
    """Sends a kept request again through the gateway (``opod.leader.leader.Replayer``)."""

    async def replay(self, path: str, body: bytes, request_id: str) -> tuple[int, bytes]:
        """(path, body, request id) → (status, body), served as the admin key's own request."""
        ...


class Serving(Protocol):
    """Registry plans and serve jobs (``opod.control.serving.ServeJobs``) as the routes see them."""

    async def plan(self, repo: str | None, format: str | None, context: int | None) -> ModelservePlan: ...

    async def start(self, request: ModelserveRequest, audit: AuditDraft) -> ModelserveJob: ...

    async def jobs(self) -> list[ModelserveJob]: ...

    async def job(self, job_id: str) -> ModelserveJob: ...


class Updating(Protocol):
    """Updates and rollbacks (``opod.control.updating.Updates``) as the routes see them."""

    async def infos(self) -> list[ModelserveUpdateInfo]: ...

    async def check(self, name: str | None) -> list[ModelserveUpdateInfo]: ...

    async def update(self, name: str, change: ModelserveChange | None, audit: AuditDraft) -> ModelserveJob: ...

    async def rollback(self, name: str, audit: AuditDraft) -> str: ...

    async def set_origin(self, name: str, repo: str | None, audit: AuditDraft) -> OriginView: ...


class Notifier(Protocol):
    """What ``/notify/test`` asks of the leader's webhooks (``opod.leader.webhooks.Webhooks``)."""

    async def test(self) -> list[tuple[str, str]]:
        """A test event to every webhook now: ``(url, error)`` each, error ``""`` when it answered 2xx."""
        ...


class ReplicaRecord(Protocol):
    """One replica as the reconciler tracks it (``opod.leader.replicas.Replica``)."""

    id: str
    model: str
    profile: int
    """Index into its model's profiles (placement's ``Held.profile``)."""
    klass: str
    """Its model's capacity class when it was placed."""
    profile_name: str
    nodes: list[str]
    gpus: dict[str, list[int]]
    state: str
    started: float
    ready_at: float
    error: str
    restart: str
    restart_waits: str
    """Why its queued restart cannot go on now; empty while it can."""
    replaces: str
    """The replica it takes over from (a restart or a drain); empty for none."""
    fingerprint: str


class ReplicaDesk(Reconciling, Protocol):
    """What the management API asks of the reconciler (``opod.leader.reconciler.Reconciler``)."""

    last_rejections: dict[str, list[Rejection]]
    """model → why each node was refused at its last placement attempt (``explain-placement``)."""

    def status(self, model: str) -> str:
        """The model's state in words (``serving on n1``, ``cannot be placed now: ...``)."""
        ...

    def replica_list(self) -> Sequence[ReplicaRecord]: ...

    def last_request(self, model: str) -> float | None:
        """``time.monotonic()`` of the last request for ``model``; ``None`` when none came."""
        ...

    def queue_restart(
        self, replica_ids: list[str], *, in_place: bool, max_surge: int, max_unavailable: int
    ) -> list[str]: ...

    def retry(self, model: str) -> bool: ...

    def parked(self) -> list[tuple[str, int, str]]:
        """(model, failures, reason) of every parked model."""
        ...


class ControlError(Exception):
    """A refusal of the management API: ``{"error": "..."}`` with a status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
