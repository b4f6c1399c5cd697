"""A kept request served again through the gateway, as the operator's own request."""

from __future__ import annotations

from collections.abc import Callable

from opod.access.keytable import KeyEntry
from opod.gateway.app import Gateway


class Replayer:
    """A kept request served again in process, as the admin key (``POST /api/v1/requests/{id}/replay``).

    A replay is the operator's own request: its cost and its usage row are the operator's, never
    charged to the project whose request it repeats, and a revoked key does not stop it.
    """

    def __init__(self, gateway: Gateway, local_keys: Callable[[], list[KeyEntry]]) -> None:
        self.gateway = gateway
        self.local_keys = local_keys

    async def replay(self, path: str, body: bytes, request_id: str) -> tuple[int, bytes]:
        entry = next((k for k in self.local_keys() if k.kind == "admin" and not k.revoked), None)
        response = await self.gateway.serve_as(entry, path, body, request_id)
        data = getattr(response, "body", None)
        if not isinstance(data, bytes | memoryview):
            data = b"".join(
                [c if isinstance(c, bytes) else str(c).encode() async for c in response.body_iterator]  # type: ignore[attr-defined]
            )
        return response.status_code, bytes(data)
