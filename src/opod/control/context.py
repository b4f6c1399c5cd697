"""What the management API works on: the store and the leader's in-memory state, shared with the gateway."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from opod.access.service import AccessService
from opod.catalog import Catalog
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet
from opod.store import Store


@dataclass(frozen=True, slots=True)
class ControlContext:
    store: Store
    """Synchronous: called through :func:`opod.access.offloop.run_sync`."""
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


class ControlError(Exception):
    """A refusal of the management API: ``{"error": "..."}`` with a status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|d)")


def parse_lifetime(text: str | None, field: str = "expires_in") -> timedelta | None:
    """A lifetime such as ``720h``, ``30d`` or ``1h30m``; empty or ``none`` = never expires."""
    if text is None or text.strip().lower() in ("", "none", "never"):
        return None
    value = text.strip().lower()
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ControlError(400, f"{field}: {text!r} is not a lifetime; write it like 720h, 30d or 1h30m (or none)")
    seconds = sum(float(n) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise ControlError(400, f"{field}: a lifetime must be longer than zero")
    return timedelta(seconds=seconds)
