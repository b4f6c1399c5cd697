"""What this leader says it can do: the frozen routes, the feature keys whose behaviour works, the engines."""

from __future__ import annotations

from opod.contract import adminapi
from opod.contract.features import FEATURE_KEYS, frozen_routes
from opod.engines.registry import engine_infos

SUPPORTED = frozenset(
    {
        "events_stream",
        "usage_stream",
        "loadz",
        "stream_boot",
        "load_signals",
        "boot_id",
        "engine_liveness",
        "probe_header",
        "probe_port",
        "router_only_ready",
        "tool_calls",
        "response_format",
        "openai_passthrough",
        "rerank",
        "worker_sleep",
        "worker_goodbye",
        "ttft",
        "engines",
        "heartbeat_no_report",
        "model_move",
        "worker_engine",
        "resident_models",
        "worker_unload",
        "node_drain",
        "model_revision",
        "auth_file",
        "policy_file",
        "plan_file",
        "shards",
        "tls_listener",
        "mtls",
        "routing_load_aware",
        "routing_weights",
        "kv_block_events",
        "lora",
        "adapters_runtime",
    }
)
"""Feature keys listed only because their behaviour works in this build (a missing key means false)."""

assert SUPPORTED <= set(FEATURE_KEYS), sorted(SUPPORTED - set(FEATURE_KEYS))


def capabilities(extra_off: frozenset[str] = frozenset()) -> adminapi.Capabilities:
    features = {key: True for key in FEATURE_KEYS if key in SUPPORTED and key not in extra_off}
    return adminapi.Capabilities(
        contract=adminapi.CONTRACT_VERSION, routes=frozen_routes(), features=features, engines=engine_infos()
    )
