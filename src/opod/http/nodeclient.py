"""Calls from the leader to its workers, signed as each worker's node identity.

One pooled aiohttp session for every worker (keep-alive connections, no limit on
their number) for control calls, the lean ``Upstreams`` pool for relayed
``/v1`` requests, and one signer per worker so each call carries a fresh nonce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import aiohttp

from opod.http.upstream import Upstreams

CONNECT_TIMEOUT = 3.0


class NodeAddress(Protocol):
    """What a call needs to know of a worker: its node id (whose token signs) and where it listens."""

    @property
    def id(self) -> str: ...

    @property
    def address(self) -> str: ...

    def base_url(self) -> str: ...


class NodeSigner(Protocol):
    """Signs one node identity's calls (``opod.security.signer.Signer``): a fresh nonce each time."""

    def headers(self, method: str, path: str) -> dict[str, str]: ...


SignerFactory = Callable[[str, str], NodeSigner]
"""(node id, node token) → its signer; the composition root passes ``opod.security.signer.Signer``."""


class WorkerUnavailable(Exception):
    """The worker could not be reached, or its token is gone."""


class WorkerClient:
    def __init__(self, token_for: Callable[[str], str | None], signer: SignerFactory) -> None:
        self._token_for = token_for
        self._new_signer = signer
        self._signers: dict[tuple[str, str], NodeSigner] = {}
        self._session: aiohttp.ClientSession | None = None
        self.upstream = Upstreams(CONNECT_TIMEOUT)
        """Keep-alive connections for relaying ``/v1`` requests to workers and same-host engines."""

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, enable_cleanup_closed=True)
            timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_connect=CONNECT_TIMEOUT)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        return self._session

    async def close(self) -> None:
        await self.upstream.close()
        if self._session is not None:
            await self._session.close()

    def signed_headers(self, node: NodeAddress, method: str, path: str) -> dict[str, str]:
        token = self._token_for(node.id)
        if token is None:
            raise WorkerUnavailable(f"no token for worker {node.id}: its node token was revoked or removed")
        key = (node.id, token)
        signer = self._signers.get(key)
        if signer is None:
            signer = self._signers[key] = self._new_signer(node.id, token)
        return signer.headers(method, path)

    async def call_json(
        self,
        node: NodeAddress,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 30.0,
        extra_headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        """A control call (load, unload, sleep, tokenize): status and the parsed body (JSON or text)."""
        headers = self.signed_headers(node, method, path)
        if extra_headers:
            headers.update(extra_headers)
        try:
            async with self.session.request(
                method, node.base_url() + path, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                text = await resp.text()
                if resp.content_type == "application/json":
                    try:
                        import json

                        return resp.status, json.loads(text)
                    except ValueError:
                        pass
                return resp.status, text
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise WorkerUnavailable(
                f"worker {node.id} at {node.address} did not answer {path}: {err or type(err).__name__}"
            ) from err
