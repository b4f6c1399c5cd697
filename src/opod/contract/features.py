"""Feature keys and the frozen ``/admin/v1`` route list (CONTRACT.md §2.9, Appendix A).

A manager probes ``Capabilities.features`` instead of sniffing versions; a
missing key means false. The route list is append-only: a route here never
disappears from a leader that speaks contract ``v1``.
"""

from __future__ import annotations

from typing import Final

from opod.contract.adminapi import Route

FEATURE_KEYS: Final[tuple[str, ...]] = (
    "events_stream",
    "usage_stream",
    "loadz",
    "shards",
    "plan_file",
    "auth_file",
    "router_only_ready",
    "routing_weights",
    "model_revision",
    "adapters_runtime",
    "vram_budget",
    "stream_boot",
    "load_signals",
    "lora",
    "boot_id",
    "engine_liveness",
    "plan_heal_gangs",
    "probe_header",
    "self_load",
    "probe_port",
    "mtls",
    "tls_listener",
    "pd_roles",
    "tool_calls",
    "response_format",
    "openai_passthrough",
    "rerank",
    "routing_load_aware",
    "kv_block_events",
    "request_wake",
    "worker_sleep",
    "policy_file",
    "shard_head",
    "shard_groups",
    "shard_sglang",
    "gang_load",
    "gateway_spend",
    "worker_goodbye",
    "ttft",
    "engines",
    "fetch_snapshot",
    "otlp_logs",
    "cache_prune",
    "placement_drain",
    "heartbeat_no_report",
    "model_move",
    "worker_engine",
    "resident_models",
    "worker_unload",
    "node_drain",
    "gang_devices_per_rank",
)
"""Every feature key the contract names, in the order opod-core lists them."""

_FROZEN: Final[tuple[tuple[str, str], ...]] = (
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/loadz"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/admin/v1/nodes/register"),
    ("POST", "/admin/v1/nodes/heartbeat"),
    ("GET", "/admin/v1/version"),
    ("GET", "/admin/v1/capabilities"),
    ("GET", "/admin/v1/nodes"),
    ("POST", "/admin/v1/nodes/{id}/sleep"),
    ("POST", "/admin/v1/nodes/{id}/resume"),
    ("GET", "/admin/v1/models"),
    ("POST", "/admin/v1/models/{id}/load"),
    ("POST", "/admin/v1/adapters"),
    ("DELETE", "/admin/v1/adapters/{name}"),
    ("POST", "/admin/v1/healthcheck"),
    ("GET", "/admin/v1/events/stream"),
    ("GET", "/admin/v1/usage/stream"),
    ("GET", "/admin/v1/shards"),
    ("POST", "/admin/v1/shards/create"),
    ("DELETE", "/admin/v1/shards/{model_id}"),
    ("DELETE", "/admin/v1/shards/{model_id}/{gang_id}"),
    ("POST", "/admin/v1/nodes/{id}/drain"),
    ("POST", "/admin/v1/nodes/{id}/undrain"),
    ("POST", "/admin/v1/models/{id}/move"),
    ("POST", "/v1/rerank"),
)


def frozen_routes() -> list[Route]:
    """The 28 frozen routes, in order; a fresh list each call."""
    return [Route(method=m, path=p) for m, p in _FROZEN]
