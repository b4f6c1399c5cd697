"""A uvicorn HTTP protocol that hands the TLS peer to the app.

uvicorn does not put the client certificate in the ASGI scope, and an ASGI
middleware cannot reach the transport. This protocol reads the peer once, when
the connection is made (after the handshake), and wraps its app so every
request on that connection carries a :class:`~opod.http.tls.peer.TLSConnection`
under ``scope["extensions"]["opod.http.tls"]``. Only TLS listeners use it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from opod.http.tls.peer import SCOPE_KEY, PeerCert, TLSConnection

log = logging.getLogger("opod.http.tls")

NODE_CA_ATTR = "opod_node_ca"
"""Set by :class:`~opod.http.tls.server.LeaderTLS` on each context it builds: the node CA it verifies against."""


def read_connection(transport: asyncio.BaseTransport) -> TLSConnection | None:
    """The TLS facts of a transport; None when it is not TLS."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    node_ca = getattr(ssl_object.context, NODE_CA_ATTR, None)
    peer = None
    # The dict form is empty unless the certificate was verified, which is what is wanted here.
    cert = ssl_object.getpeercert()
    if cert:
        try:
            peer = PeerCert.from_peercert(cert)
        except (ValueError, KeyError) as err:  # an odd date or field: treat as no certificate, say why
            log.warning("could not read the client certificate of %s: %s", transport.get_extra_info("peername"), err)
    return TLSConnection(node_ca, peer)


class _WithTLS:
    __slots__ = ("app", "tls")

    def __init__(self, app: Any, tls: TLSConnection) -> None:
        self.app = app
        self.tls = tls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extensions = scope.get("extensions")
        if extensions is None:
            scope["extensions"] = {SCOPE_KEY: self.tls}
        else:
            extensions[SCOPE_KEY] = self.tls
        await self.app(scope, receive, send)


class TLSHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        tls = read_connection(transport)
        if tls is not None:
            self.app = _WithTLS(self.app, tls)
