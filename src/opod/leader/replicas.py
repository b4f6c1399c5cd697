"""Replicas as the leader tracks them, and how many a model's definition asks for now.

A replica is one running copy of a model: a profile of its definition, on one
node or across several (rank 0 first, rank 0 serves), with the GPUs it was given
on each. Its life: ``starting`` (load calls sent) → ``ready`` (rank 0's heartbeat
lists the model) → ``draining`` (being stopped) or ``failed``.

Nothing here is stored: what workers report is the one record of what runs. Each
load names its replica (:func:`load_requests`), and a restarted leader adopts the
replicas its workers repeat in their heartbeats (:mod:`opod.leader.adoption`).

How many: the catalog's scaling in force (``opod.catalog.definition.scaling_in_force``:
no scaling is one replica); ``min 0`` with a ``max`` is on demand, one replica while
requests ask for it and none once ``idle_timeout`` has passed without one. The first ``schedule`` window that holds now (or will
within ``prewarm``) replaces min and max.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from opod.catalog.adapters import load_adapters
from opod.catalog.definition import class_in_force, scaling_in_force
from opod.contract import nodeapi
from opod.contract.admin.catalog import CatalogModel, CatalogScaleWindow, CatalogScaling
from opod.fleet.models import KnownModel

STARTING, READY, DRAINING, FAILED = "starting", "ready", "draining", "failed"
ACTIVE = (STARTING, READY, DRAINING)
"""States that hold devices."""

DEFAULT_IDLE_TIMEOUT = 900.0
"""Seconds an on-demand model may go unasked-for when its definition says 0 (the cluster default)."""
NS = 1_000_000_000
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_GROUPS = {"weekdays": DAYS[:5], "weekends": DAYS[5:], "weekday": DAYS[:5], "weekend": DAYS[5:]}


@dataclass(slots=True)
class Replica:
    id: str
    model: str
    profile: int
    profile_name: str
    klass: str
    nodes: list[str]
    """Rank order: rank 0 first, and it serves."""
    gpus: dict[str, list[int]] = field(default_factory=dict)
    state: str = STARTING
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    ready_at: float = 0.0
    error: str = ""
    restart: str = ""
    """``queued`` or ``replacing`` while an operator's restart of it is under way."""
    in_place: bool = False
    """Its queued restart stops it before its replacement starts."""
    restart_waits: str = ""
    """Why its queued restart cannot go on now (no node takes its replacement); empty while it can."""
    replaces: str = ""
    """The replica this one takes over from (a restart or a drain), stopped once this one is ready."""
    replaced_by: str = ""
    fingerprint: str = ""
    """The definition it was placed from: a different one now makes it ``stale``."""
    ever_ready: bool = False
    unloaded: bool = False
    """Its failure has been cleaned off its nodes."""
    cpu_cores: float = 0.0
    memory_gb: float = 0.0
    """What it reserves on each of its nodes, as placement gave it."""


@dataclass(slots=True)
class Parking:
    """A model's run of failed starts; parked once it reaches ``PARK_AFTER``."""

    failures: int = 0
    reason: str = ""
    parked: bool = False
    next_try: float = 0.0
    fingerprint: str = ""


def scaling_of(definition: CatalogModel) -> CatalogScaling:
    return definition.scaling if definition.scaling is not None else CatalogScaling()


def on_demand(definition: CatalogModel) -> bool:
    return scaling_in_force(definition)[3]


def capacity_class(definition: CatalogModel) -> str:
    """The model's class: its own, else ``opportunistic`` when on demand, else ``standard`` (the catalog's one rule)."""
    return class_in_force(definition)


def idle_timeout(definition: CatalogModel) -> float:
    ns = scaling_in_force(definition)[2]
    return ns / NS if ns > 0 else DEFAULT_IDLE_TIMEOUT


def _days(window: CatalogScaleWindow) -> set[str]:
    out: set[str] = set()
    for day in window.days or []:
        word = day.strip().lower()[:3] if day.strip().lower() not in _DAY_GROUPS else day.strip().lower()
        out.update(_DAY_GROUPS.get(word, (word,)))
    return out or set(DAYS)


def _seconds(hhmm: str | None) -> int:
    if not hhmm:
        return 0
    hours, _, minutes = hhmm.partition(":")
    return int(hours) * 3600 + int(minutes or 0) * 60


def window_holds(window: CatalogScaleWindow, at: datetime) -> bool:
    """Whether ``at`` (local time) is inside the window; a window whose ``to`` is before its ``from`` runs past midnight."""
    days = _days(window)
    start, end = _seconds(window.from_), _seconds(window.to)
    tod = at.hour * 3600 + at.minute * 60 + at.second
    today, yesterday = DAYS[at.weekday()], DAYS[(at.weekday() - 1) % 7]
    if start == end:
        return today in days
    if start < end:
        return today in days and start <= tod < end
    return (tod >= start and today in days) or (tod < end and yesterday in days)


def in_force(definition: CatalogModel, at: datetime) -> tuple[int, int]:
    """(min, max) now: the first schedule window that holds at ``at`` or within ``prewarm`` of it, else the model's own."""
    low, high, _, _ = scaling_in_force(definition)
    scaling = scaling_of(definition)
    prewarm = timedelta(seconds=(scaling.prewarm or 0) / NS)
    for window in scaling.schedule or []:
        if window_holds(window, at) or (prewarm and window_holds(window, at + prewarm)):
            floor = window.min or 0
            return floor, max(window.max or high, floor)
    return low, high


def desired_count(definition: CatalogModel, at: datetime, demanded: bool) -> int:
    """Replicas wanted now: min, or for an on-demand model (min 0, max above it) one while requests ask for it."""
    low, high = in_force(definition, at)
    if low > 0:
        return min(low, high) if high >= 1 else low
    return 1 if demanded and high > 0 else 0


def load_requests(model: KnownModel, replica: Replica, peers: list[str]) -> list[tuple[str, nodeapi.LoadModelRequest]]:
    """What each rank's worker is asked to load: the replica's devices, profile and, across nodes, rank and ``peers`` (their addresses)."""
    definition = model.definition
    profiles = (definition.profiles or []) if definition is not None else []
    profile = profiles[replica.profile] if replica.profile < len(profiles) else None
    source = model.entry.source if model.entry is not None else None
    path, repo = (source.path, source.repo) if source is not None else ("", "")
    if source is None and definition is not None and definition.source:
        text = definition.source.removeprefix("hf:")
        path, repo = (text, "") if text.startswith(("/", "./", "~")) or text.endswith(".gguf") else ("", text)
    out = []
    for rank, node_id in enumerate(replica.nodes):
        out.append(
            (
                node_id,
                nodeapi.LoadModelRequest(
                    id=model.id,
                    ollama_name=source.ollama_name if source else "",
                    repo=repo,
                    file=source.file if source else "",
                    path=path,
                    replica=replica.id,
                    devices=list(replica.gpus.get(node_id, [])) or None,
                    tp=(profile.tp or 0) if profile else 0,
                    pp=(profile.pp or 0) if profile else 0,
                    engine=(profile.engine or "") if profile else "",
                    args=list(profile.args) if profile and profile.args else None,
                    env=dict(profile.env) if profile and profile.env else None,
                    rank=rank,
                    peers=peers if len(replica.nodes) > 1 else None,
                    profile=replica.profile,
                    fingerprint=replica.fingerprint,
                    adapters=load_adapters(definition),
                    revision=source.revision if source is not None else "",
                ),
            )
        )
    return out
