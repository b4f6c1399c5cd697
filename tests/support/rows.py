"""A usage row as the ledger commits it, for tests that put request records in a store directly."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from opod.store.usage import NewUsage


def usage_row(entry: str, **fields: Any) -> NewUsage:
    """A finished ``ok`` request of model ``m`` by key ``k``, now, named ``entry``; ``fields`` say what differs."""
    row: dict[str, Any] = {
        "entry": entry,
        "request_id": entry,
        "ts": datetime.now(UTC),
        "api_key_id": "k",
        "user_id": "",
        "model": "m",
        "protocol": "openai",
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "latency_ms": 1,
        "ttft_ms": 0,
        "outcome": "ok",
        "node_id": "",
    }
    return NewUsage(**(row | fields))
