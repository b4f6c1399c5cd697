"""The gang record, and the request and response shapes of the shard operations.

All are pydantic models, so the lead's routes answer ``model_dump(mode="json")``
and read a request with ``CreateShards.model_validate(body)``. A gang record is
also what is persisted: :func:`gangs_to_json` / :func:`gangs_from_json` carry
the whole set with a format version, and refuse text they cannot read with the
reason rather than restoring half of it.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, Field, ValidationError

FORMAT_VERSION = 1
MAX_SHARDS = 64
"""More RPC parts than this is a typo, not a plan: llama.cpp splits by layer, and models have ~100 at most."""


class GangState(StrEnum):
    FORMING = "forming"
    """Parts and coordinator are being started (create)."""
    SERVING = "serving"
    HEALING = "healing"
    """A part or the coordinator was lost and is being replaced."""
    DEGRADED = "degraded"
    """A heal failed; ``detail`` says why, and the healer tries again each round."""
    REMOVING = "removing"


class ProcessState(StrEnum):
    """One process of a gang (an RPC part or the coordinator), as the leader last saw it."""

    STARTING = "starting"
    RUNNING = "running"
    LOST = "lost"
    """Its worker is gone or the process ended; the healer replaces it."""
    STOPPED = "stopped"


class Part(BaseModel):
    index: int
    """Position in the coordinator's ``--rpc`` list; llama.cpp assigns layers in this order."""
    node: str
    address: str
    """``host:port`` the coordinator dials (the worker's host, the part's port)."""
    port: int
    process_id: str
    """The id of the ``rpc-server`` process on that worker (``/v1/process/get?id=``)."""
    command: str = ""
    state: ProcessState = ProcessState.STARTING
    detail: str = ""


class Coordinator(BaseModel):
    node: str
    address: str
    """The worker's own address: the coordinator's model is served through the worker's data path."""
    weights: str = ""
    """The GGUF path on that worker, or ``""`` when the worker fetches the source itself."""
    uploaded: bool = False
    """Whether this gang's create sent the GGUF to the worker (``False``: it was there, matched by sha256)."""
    state: ProcessState = ProcessState.STARTING
    detail: str = ""


class Gang(BaseModel):
    id: str
    model: str
    shards: int
    port_base: int
    state: GangState = GangState.FORMING
    coordinator: Coordinator
    parts: list[Part] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    healed_at: datetime | None = None
    heals: int = 0
    detail: str = ""
    """Why the gang is degraded, or what the last heal did."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds each step of the last create or heal took: ``parts``, ``weights``, ``coordinator``, ``total``."""

    def rpc_list(self) -> str:
        """The coordinator's ``--rpc`` value: every part's address, in index order."""
        return ",".join(p.address for p in sorted(self.parts, key=lambda p: p.index))

    def nodes(self) -> set[str]:
        return {p.node for p in self.parts} | {self.coordinator.node}


def new_gang_id() -> str:
    return "g" + secrets.token_hex(4)


def part_process_id(model: str, gang_id: str, index: int) -> str:
    """Unique on a worker, and readable in its process list."""
    return f"shard-{model}-{gang_id}-p{index}"


# --- request and response shapes of the operations ---------------------------------


class CreateShards(BaseModel):
    """Body of ``POST /admin/v1/shards/create``: ``shards`` absent = the catalog's ``default_shards``."""

    model: str = Field(min_length=1)
    shards: int | None = Field(None, ge=1, le=MAX_SHARDS)


class GangList(BaseModel):
    """Answer of ``GET /admin/v1/shards``."""

    gangs: list[Gang]


class RemovedGangs(BaseModel):
    """Answer of ``DELETE /admin/v1/shards/{model_id}`` (and, with one gang, ``…/{gang_id}``)."""

    model: str
    removed: list[Gang]
    unreached: list[str] = Field(default_factory=list)
    """Workers that could not be told to stop their process (gone already, or unreachable): ``node: why``."""


# --- persistence --------------------------------------------------------------------


class _Stored(BaseModel):
    version: int
    gangs: list[Gang]


def gangs_to_json(gangs: list[Gang]) -> str:
    return _Stored(version=FORMAT_VERSION, gangs=gangs).model_dump_json()


def gangs_from_json(text: str | bytes) -> list[Gang]:
    """The gangs saved by :func:`gangs_to_json`; ``ValueError`` naming the problem otherwise."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ValueError(f"stored gangs are not JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
        found = raw.get("version") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"stored gangs have format version {found!r}; this leader reads version {FORMAT_VERSION}")
    try:
        return _Stored.model_validate(raw).gangs
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5])
        raise ValueError(f"stored gangs are not valid: {problems}") from None
