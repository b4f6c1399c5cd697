"""The environment contract (CONTRACT.md §3): every variable a manager may set.

A manager renders a pod template or a unit file from these rows; a leader and a
worker read exactly these names (plus the config overrides declared in
:mod:`opod.config`). A variable that stops being read moves to the retired
table, never silently away, so a manager hears "retired" instead of "unknown".

``since`` is the ``Capabilities.features`` key to probe before relying on the
variable, or the SDK version that first listed it; empty means every binary
speaking this contract.
"""

from __future__ import annotations

from typing import Annotated, Final

from opod.contract.adminapi import Side
from opod.contract.wire import OMITEMPTY, WireModel


class EnvVar(WireModel):
    name: str = ""
    side: str = ""
    doc: str = ""
    since: Annotated[str, OMITEMPTY] = ""


class RetiredEnvVar(WireModel):
    name: str = ""
    retired_in: str = ""
    note: str = ""


ENV_PLAN_FILE: Final = "OPOD_PLAN_FILE"
ENV_AUTH_FILE: Final = "OPOD_AUTH_FILE"
ENV_POLICY_FILE: Final = "OPOD_POLICY_FILE"
ENV_COORDINATOR_NODE: Final = "OPOD_COORDINATOR_NODE"
ENV_OTLP_LOGS_ENDPOINT: Final = "OPOD_OTLP_LOGS_ENDPOINT"
ENV_ACCELERATOR: Final = "OPOD_ACCELERATOR"
ENV_ENGINE_FLAGS: Final = "OPOD_ENGINE_FLAGS"
ENV_ADAPTERS: Final = "OPOD_ADAPTERS"
ENV_REJECT_BEARER: Final = "OPOD_REJECT_BEARER"
ENV_SLEEP_MODE: Final = "OPOD_SLEEP_MODE"
ENV_WORKER_ROLE: Final = "OPOD_WORKER_ROLE"
ENV_PLAN_REVISION: Final = "OPOD_PLAN_REVISION"
ENV_ADVERTISE_ADDR: Final = "OPOD_ADVERTISE_ADDR"
ENV_NODE_ID: Final = "OPOD_NODE_ID"
ENV_LEADER_CA: Final = "OPOD_LEADER_CA"
ENV_VRAM_BUDGET_GB: Final = "OPOD_VRAM_BUDGET_GB"
ENV_GPU_INDEX: Final = "OPOD_GPU_INDEX"
ENV_CATALOG_DIR: Final = "OPOD_CATALOG_DIR"
ENV_CATALOG_PUBKEY: Final = "OPOD_CATALOG_PUBKEY"
ENV_CATALOG_REQUIRE_SIGNED: Final = "OPOD_CATALOG_REQUIRE_SIGNED"
ENV_SKIP_SOURCE_CHECK: Final = "OPOD_SKIP_SOURCE_CHECK"
ENV_HF_TOKEN: Final = "HF_TOKEN"
ENV_HF_ENDPOINT: Final = "HF_ENDPOINT"
ENV_MODEL_REVISION: Final = "OPOD_MODEL_REVISION"
ENV_MODEL_SHA256: Final = "OPOD_MODEL_SHA256"

RETIRED_ENV_UI: Final = "OPOD_UI"
RETIRED_ENV_EGRESS: Final = "OPOD_EGRESS"
RETIRED_ENV_CALLBACKS: Final = "OPOD_CALLBACKS"

_L, _W, _B = Side.LEADER.value, Side.WORKER.value, Side.BOTH.value

_ROWS: Final[tuple[tuple[str, str, str, str], ...]] = (
    (
        ENV_PLAN_FILE,
        _L,
        "Path of the plan file the leader serves within (default /etc/opod/plan.json); unset means a standalone leader.",
        "plan_file",
    ),
    (
        ENV_AUTH_FILE,
        _L,
        "Path of the watched auth snapshot: hashed keys and requireKeys (default /etc/opod-auth/auth.json); 'off' disables the watcher.",
        "auth_file",
    ),
    (
        ENV_POLICY_FILE,
        _L,
        "Path of the watched policy snapshot: routing, logging, guardrails, admission (default /etc/opod-auth/policy.json); 'off' disables the watcher.",
        "policy_file",
    ),
    (
        ENV_COORDINATOR_NODE,
        _L,
        "Node id that hosts the llama.cpp RPC coordinator of a sharded model; 'local' means the leader itself.",
        "shards",
    ),
    (
        ENV_OTLP_LOGS_ENDPOINT,
        _L,
        "OTLP/HTTP collector (URL or host:port) that also receives the leader's log records, through a bounded queue that never blocks; empty means off.",
        "otlp_logs",
    ),
    (
        ENV_ACCELERATOR,
        _W,
        "Accelerator vendor the manager placed this worker on: nvidia, amd, intel, tt or none; unset means detect.",
        "",
    ),
    (ENV_ENGINE_FLAGS, _W, "JSON object of engine flags from the plan (tp, max_model_len, ctx, ngl, ...).", ""),
    (ENV_ADAPTERS, _W, "JSON array of LoRA adapters [{name, source, rank}], each served as <model>:<name>.", "lora"),
    (ENV_REJECT_BEARER, _W, "1 means the worker's API accepts HMAC-signed calls only, never a bearer token.", ""),
    (
        ENV_SLEEP_MODE,
        _W,
        "1 means vLLM starts with sleep mode enabled, for the sleep autoscaling tier.",
        "worker_sleep",
    ),
    (
        ENV_WORKER_ROLE,
        _W,
        "prefill or decode for disaggregated serving; unset means the worker serves whole requests.",
        "pd_roles",
    ),
    (
        ENV_PLAN_REVISION,
        _W,
        "Plan revision this worker was started for; the leader can split traffic by revision.",
        "routing_weights",
    ),
    (
        ENV_ADVERTISE_ADDR,
        _W,
        "host:port the leader should dial to reach this worker (overlay networks, several NICs).",
        "",
    ),
    (ENV_NODE_ID, _W, "Node id kept across restarts; otherwise taken from node.yaml, otherwise generated.", ""),
    (
        ENV_LEADER_CA,
        _W,
        "PEM certificate the worker trusts, and only it, when the leader listens with TLS.",
        "tls_listener",
    ),
    (
        ENV_VRAM_BUDGET_GB,
        _W,
        "Share of the GPU's memory, in GB, this worker's engine may use when a card is shared.",
        "vram_budget",
    ),
    (
        ENV_GPU_INDEX,
        _W,
        "Index of the device this worker was pinned to (informational; the engine sees CUDA_VISIBLE_DEVICES).",
        "vram_budget",
    ),
    (
        ENV_CATALOG_DIR,
        _B,
        "Directory of catalog entries that override the bundled ones (only ~/.opod/catalog takes precedence over it).",
        "",
    ),
    (
        ENV_CATALOG_PUBKEY,
        _B,
        "Minisign public key (the base64 line, or a file holding it); a catalog file with a .minisig beside it must verify, the bundled catalog is never checked.",
        "v0.3.0",
    ),
    (
        ENV_CATALOG_REQUIRE_SIGNED,
        _B,
        "1 means catalog files without a signature are refused too (needs OPOD_CATALOG_PUBKEY).",
        "v0.3.0",
    ),
    (ENV_SKIP_SOURCE_CHECK, _B, "1 means never check a model's upstream source (air-gapped mirrors).", ""),
    (ENV_HF_TOKEN, _B, "Hugging Face token for gated repositories.", ""),
    (ENV_HF_ENDPOINT, _B, "Hugging Face Hub base URL, for a mirror; default https://huggingface.co.", ""),
    (
        ENV_MODEL_REVISION,
        _B,
        "Hub revision (commit, tag or branch) to pin the model to; cached as <repo>@<rev>; empty means main.",
        "model_revision",
    ),
    (
        ENV_MODEL_SHA256,
        _B,
        "Expected SHA-256 of the model file; on a mismatch the file is removed and the load fails.",
        "model_revision",
    ),
)

_RETIRED: Final[tuple[tuple[str, str, str], ...]] = (
    (
        RETIRED_ENV_UI,
        "v0.3.0",
        "Switched the built-in web dashboard off; there is no such dashboard any more, so it is accepted and has no effect.",
    ),
    (
        RETIRED_ENV_EGRESS,
        "v0.3.0",
        "Switched calls to hosted model vendors off; no such calls are made any more, so it is accepted and has no effect.",
    ),
    (
        RETIRED_ENV_CALLBACKS,
        "v0.3.0",
        "Switched the callback sinks off; there are none any more, so it is accepted and has no effect.",
    ),
)


def env() -> list[EnvVar]:
    """Every contract variable, in the leader's order; a fresh copy each call."""
    return [EnvVar(name=n, side=s, doc=d, since=v) for n, s, d, v in _ROWS]


def retired() -> list[RetiredEnvVar]:
    """Variables no longer read, each with the version that retired it; a fresh copy."""
    return [RetiredEnvVar(name=n, retired_in=r, note=t) for n, r, t in _RETIRED]


def lookup(name: str) -> EnvVar | None:
    """The row for ``name`` (exact match), or ``None``."""
    for row in _ROWS:
        if row[0] == name:
            return EnvVar(name=row[0], side=row[1], doc=row[2], since=row[3])
    return None


def lookup_retired(name: str) -> RetiredEnvVar | None:
    """The retired row for ``name`` (exact match), or ``None``."""
    for row in _RETIRED:
        if row[0] == name:
            return RetiredEnvVar(name=row[0], retired_in=row[1], note=row[2])
    return None
