"""What a leader serves to a manager, and the files a manager mounts (CONTRACT.md §2).

The JSON of ``/admin/v1``, of ``/loadz``, of the usage and lifecycle streams,
and of the auth and policy snapshot files. Fields are declared in wire order;
their aliases are the JSON keys. Keys marked "opod" are additions designed here
for types the contract names without keys (§2.10); they are all optional, so
a reader that does not know them loses nothing.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from opod.contract.wire import OMITEMPTY, OMITNIL, OMITZERO, WireModel

CONTRACT_VERSION = "v1"

SNAPSHOT_KEY_PREFIX = "k_cp_"
"""A usage row's ``api_key_id`` for a key from the auth file: ``k_cp_<id>``."""

ADMIN_KEY_PREFIX = "sk-orc-"
"""Admin keys printed by ``opod up`` start with this."""


class Side(StrEnum):
    """Which process reads an environment variable."""

    LEADER = "leader"
    WORKER = "worker"
    BOTH = "both"


class AdmissionClass(StrEnum):
    """Rank of a request when the endpoint is full, highest first."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"


CACHE_ISOLATION_TEAM = "team"

# --- version and capabilities ---------------------------------------------


class Route(WireModel):
    method: str = ""
    path: str = ""


class Version(WireModel):
    version: str = ""
    contract: str = ""


class EngineInfo(WireModel):
    """One linked engine driver; ``native`` is the catalog source field it pulls by."""

    id: str = ""
    aliases: Annotated[list[str] | None, OMITEMPTY] = None
    native: str = ""


class Capabilities(WireModel):
    """Body of ``GET /admin/v1/capabilities``. A missing feature key means false."""

    contract: str = ""
    routes: list[Route] | None = None
    features: dict[str, bool] | None = None
    engines: list[EngineInfo] | None = Field(default_factory=list)


# --- /loadz ----------------------------------------------------------------


class PrefixIndex(WireModel):
    workers_reporting: int = 0
    blocks: int = 0


class Load(WireModel):
    """Body of ``GET /loadz``: what an autoscaler reads."""

    plan_revision: int = 0
    plan_model: str = ""
    in_flight: int = 0
    rpm_1m: int = 0
    unavailable_1m: int = 0
    last_request_unix: int = 0
    ts: int = 0
    kv_used_pct: float = 0.0
    queue_depth: int = 0
    tokens_per_s: float = 0.0
    prefix_hit_pct: float = 0.0
    workers: int = 0
    reporting: int = 0
    kv_busy_workers: float = 0.0
    prefix_index: Annotated[PrefixIndex | None, OMITNIL] = None
    ttft_p50_ms: Annotated[int, OMITEMPTY] = 0
    ttft_p95_ms: Annotated[int, OMITEMPTY] = 0
    engines_unhealthy: Annotated[int, OMITEMPTY] = 0
    engine_issue: Annotated[str, OMITEMPTY] = ""


# --- usage and lifecycle streams -------------------------------------------


class UsageData(WireModel):
    """One served request. Never carries content."""

    api_key_id: str = ""
    ttft_ms: Annotated[int, OMITEMPTY] = 0
    user_id: str = ""
    model: str = ""
    protocol: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    outcome: str = ""
    cost_usd: float = 0.0
    node_id: str = ""
    # opod additions: the request's X-Request-Id, and how it was routed (worker, reason, class).
    request_id: Annotated[str, OMITEMPTY] = ""
    route: Annotated[dict[str, Any] | None, OMITEMPTY] = None


class UsageEvent(WireModel):
    id: int = 0
    type: str = "usage"
    ts: str = ""
    data: UsageData = Field(default_factory=UsageData)


class UsageBatch(WireModel):
    """A page of ``GET /admin/v1/usage/stream?after=&limit=``."""

    events: list[UsageEvent] | None = None
    next: int = 0
    more: bool = False
    boot: Annotated[int, OMITEMPTY] = 0


class LifecycleEvent(WireModel):
    id: int = 0
    type: str = ""
    subject: str = ""
    ts: str = ""
    data: dict[str, Any] | None = None


class EventsBatch(WireModel):
    """A page of ``GET /admin/v1/events/stream?after=&limit=``."""

    events: list[LifecycleEvent] | None = None
    next: int = 0
    more: bool = False
    boot: Annotated[int, OMITEMPTY] = 0


# --- the auth snapshot (OPOD_AUTH_FILE) -------------------------------------


class SnapshotKey(WireModel):
    """An identity: who, what it is called, until when. ``hash`` is hex SHA-256 of the key."""

    id: str = ""
    name: str = ""
    hash: str = ""
    scope: Annotated[str, OMITEMPTY] = ""
    expires_at: Annotated[str, OMITEMPTY] = Field("", alias="expiresAt")
    # opod: rank when the endpoint is full, and the team that shares fairly inside a class.
    admission_class: Annotated[Literal["", "critical", "standard", "sheddable"], OMITEMPTY] = Field("", alias="class")
    team: Annotated[str, OMITEMPTY] = ""


class AuthSnapshot(WireModel):
    revision: str = ""
    require_keys: bool = Field(False, alias="requireKeys")
    keys: list[SnapshotKey] | None = None
    node_mtls: Annotated[Literal["", "off", "allow", "require"], OMITEMPTY] = Field("", alias="nodeMtls")
    node_cert_ca: Annotated[str, OMITEMPTY] = Field("", alias="nodeCertCa")
    revoked_certs: Annotated[list[str] | None, OMITEMPTY] = Field(None, alias="revokedCerts")
    revoked_keys: Annotated[list[str] | None, OMITEMPTY] = Field(None, alias="revokedKeys")
    issued_at: Annotated[str, OMITEMPTY] = Field("", alias="issuedAt")


# --- the policy snapshot (OPOD_POLICY_FILE) ---------------------------------


class RevisionWeight(WireModel):
    revision: int = 0
    weight: int = 0


class PolicyRouting(WireModel):
    fallback_url: Annotated[str, OMITEMPTY] = Field("", alias="fallbackUrl")
    fallback_model: Annotated[str, OMITEMPTY] = Field("", alias="fallbackModel")
    fallback_key: Annotated[str, OMITEMPTY] = Field("", alias="fallbackKey")
    kv_weight: Annotated[float, OMITEMPTY] = Field(0.0, alias="kvWeight")
    kv_saturation_pct: Annotated[int, OMITEMPTY] = Field(0, alias="kvSaturationPct")
    prefix_affinity: Annotated[bool, OMITEMPTY] = Field(False, alias="prefixAffinity")
    prefix_block_weight: Annotated[float, OMITEMPTY] = Field(0.0, alias="prefixBlockWeight")
    revisions: Annotated[list[RevisionWeight] | None, OMITEMPTY] = None
    # opod: "team" keeps one team's cached prefixes from steering another team's requests.
    cache_isolation: Annotated[Literal["", "team"], OMITEMPTY] = Field("", alias="cacheIsolation")


class PolicyLogging(WireModel):
    access_log: Annotated[bool | None, OMITNIL] = Field(None, alias="accessLog")


class GuardrailRule(WireModel):
    id: str = ""
    phase: Literal["pre", "post", "logging_only"] = "pre"
    url: str = ""
    auth_key: Annotated[str, OMITEMPTY] = Field("", alias="authKey")
    headers: Annotated[dict[str, str] | None, OMITEMPTY] = None
    fail_open: bool = Field(False, alias="failOpen")
    timeout_ms: Annotated[int, OMITEMPTY] = Field(0, alias="timeoutMs")


class PolicyAuth(WireModel):
    max_snapshot_age_sec: Annotated[int, OMITEMPTY] = Field(0, alias="maxSnapshotAgeSec")


class PolicyAdmissionClass(WireModel):
    """opod: per-class admission: how long a request of the class may wait, and its share cap."""

    name: Literal["critical", "standard", "sheddable"] = "standard"
    hold_ms: Annotated[int, OMITEMPTY] = Field(0, alias="holdMs")
    max_share: Annotated[float, OMITEMPTY] = Field(0.0, alias="maxShare")


class PolicyAdmission(WireModel):
    hold_ms: Annotated[int, OMITEMPTY] = Field(0, alias="holdMs")
    max_held: Annotated[int, OMITEMPTY] = Field(0, alias="maxHeld")
    classes: Annotated[list[PolicyAdmissionClass] | None, OMITEMPTY] = None


class PolicySnapshot(WireModel):
    """Every zero value means the old behaviour; an empty policy changes nothing."""

    revision: str = ""
    routing: PolicyRouting = Field(default_factory=PolicyRouting)
    logging: PolicyLogging = Field(default_factory=PolicyLogging)
    guardrails: list[GuardrailRule] | None = None
    auth: Annotated[PolicyAuth, OMITZERO] = Field(default_factory=PolicyAuth)
    admission: Annotated[PolicyAdmission, OMITZERO] = Field(default_factory=PolicyAdmission)


# --- the plan file (OPOD_PLAN_FILE) -----------------------------------------


class PlanSnapshot(WireModel):
    """opod: the plan a manager mounts: the one model this endpoint serves, and its bounds.

    The contract names the plan file without its keys (§2.10); these are opod's.
    """

    revision: int = 0
    model: str = ""
    """The model id the endpoint serves; requests for any other model are refused."""
    adapters: Annotated[list[str] | None, OMITEMPTY] = None
    """LoRA adapter names served as ``<model>:<name>``."""
    floor: Annotated[int, OMITEMPTY] = 0
    """Workers the manager keeps at least; 0 = scaling to zero (sleeping is healthy)."""
    max: Annotated[int, OMITEMPTY] = 0
    """Workers the manager allows at most; 0 = no bound stated."""


# --- the door's routes file (opod up --role door --routes FILE) -----------------


class DoorRoute(WireModel):
    """opod: one model name served by one leader behind the door."""

    alias: str = ""
    """The model name clients ask for."""
    upstream: str = ""
    """The leader's base URL (``http://host:8080``)."""
    model: Annotated[str, OMITEMPTY] = ""
    """The name the leader serves it under, when it differs from ``alias``."""
    key: Annotated[str, OMITEMPTY] = ""
    """The API key the door presents to that leader; empty = the client's own."""


class DoorRoutes(WireModel):
    """opod: the door's whole routing table, applied whole or not at all."""

    revision: str = ""
    routes: list[DoorRoute] | None = None
