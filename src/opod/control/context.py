"""What the management API works on: the store and the leader's in-memory state, shared with the gateway."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from opod.access.people import People
from opod.access.service import AccessService
from opod.access.tenancy import Tenancy
from opod.catalog import Catalog
from opod.contract import durations
from opod.fleet.models import ModelRegistry
from opod.fleet.placement import Rejection
from opod.fleet.quotas import Amount, QuotaTable
from opod.fleet.state import Fleet
from opod.http.nodeclient import WorkerClient
from opod.settings.holder import SettingsHolder
from opod.store import Store


@dataclass(frozen=True, slots=True)
class ControlContext:
    store: Store
    """Synchronous: called through :func:`opod.store.offloop.run_sync`."""
    access: AccessService
    """The one writer of keys and node tokens."""
    fleet: Fleet
    models: ModelRegistry
    catalog: Catalog
    models_changed: Callable[[], None]
    model_status: Callable[[str], str]
    emit: Callable[[str, str, dict], None]
    forget_node: Callable[[str], None]
    """Drop what the leader derived from a node (its cached prefix blocks)."""
    declared_models: frozenset[str] = frozenset()
    """Models the leader's settings declare (the built-in defaults): they cannot be removed, only scaled to 0."""
    replicas: ReplicaDesk | None = None
    """The reconciler's replicas: ``/replicas``, ``/restart``, ``/models/{name}/retry``, ``/summary``."""
    workers: WorkerClient | None = None
    """Signed calls to workers (node logs, agent restarts); ``None`` where no worker can be called."""
    cluster_settings: SettingsHolder | None = None
    """The cluster's settings in force on this leader (``/settings``); ``None`` where none are held."""
    notifier: Notifier | None = None
    """The webhooks of the cluster's settings (``POST /notify/test``); ``None`` where the leader sends none."""
    people: People | None = None
    """People and their memberships (``/users``, SCIM): the one writer; ``None`` where none are kept."""
    tenancy: Tenancy | None = None
    """Organizations, teams and projects in memory (``/orgs``, ``/teams``, ``/projects``, keys' owners): the one writer."""
    quotas: QuotaTable | None = None
    """The capacity quotas the reconciler places by (``/quotas``); changed here after the store."""
    quota_holds: Callable[[], Mapping[str, Amount]] | None = None
    """What each scope's models hold now, as the reconciler's last round counted it (``QuotaView.holds``)."""
    wake_client_jobs: Callable[[], None] | None = None
    """Tells the batch runner to look at its jobs now (a cancel); ``None`` where no runner runs."""
    replay: Callable[[str, bytes, str], Awaitable[tuple[int, bytes]]] | None = None
    """(path, body, request id) → (status, body): a kept request sent again through the gateway as the operator's
    own request (``POST /requests/{id}/replay``); ``None`` where no gateway serves."""


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
    fingerprint: str


class ReplicaDesk(Protocol):
    """What the management API asks of the reconciler."""

    last_rejections: dict[str, list[Rejection]]
    """model → why each node was refused at its last placement attempt (``explain-placement``)."""

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


def parse_lifetime(text: str | None, field: str = "expires_in") -> timedelta | None:
    """A lifetime such as ``720h``, ``30d`` or ``1h30m``; empty or ``none`` = never expires."""
    if text is None or text.strip().lower() in ("", "none", "never"):
        return None
    try:
        seconds = durations.seconds(text)
    except durations.TooLong as err:
        raise ControlError(400, f"{field}: {err}") from None
    except ValueError:
        raise ControlError(
            400, f"{field}: {text!r} is not a lifetime; write it like 720h, 30d or 1h30m (or none)"
        ) from None
    if seconds <= 0:
        raise ControlError(400, f"{field}: a lifetime must be longer than zero")
    return timedelta(seconds=seconds)
