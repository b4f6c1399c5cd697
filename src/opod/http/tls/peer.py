"""What a TLS handshake proved about the peer, in the form the join handlers read.

The listener's protocol (:mod:`opod.http.tls.protocol`) builds one :class:`TLSConnection`
per connection and puts it in every request's ASGI scope under
``scope["extensions"][SCOPE_KEY]``. A plain (non-TLS) connection has none.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SCOPE_KEY = "opod.http.tls"

_SPIFFE_NODE = re.compile(r"spiffe://([a-z0-9._-]+)/opod/node/([^/?#\s]+)")
"""The one SAN shape read (CONTRACT.md §4.2): ``spiffe://<trust domain>/opod/node/<id>``."""


@dataclass(frozen=True, slots=True)
class PeerCert:
    """A client certificate the handshake verified against the node CA then in force."""

    node_ids: tuple[str, ...]
    """Node ids named by the certificate's SPIFFE URI SANs (normally exactly one)."""
    serial: str
    """Lowercase hex without separators or leading zeros, as ``revokedCerts`` compares."""
    not_after: float
    """Expiry, seconds since the epoch."""
    subject: str = ""

    @classmethod
    def from_peercert(cls, cert: Mapping[str, Any]) -> PeerCert:
        """From ``SSLObject.getpeercert()`` (the dict form, only filled for a verified certificate)."""
        ids = spiffe_node_ids([value for kind, value in cert.get("subjectAltName", ()) if kind == "URI"])
        subject = ", ".join(f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn)
        serial = str(cert.get("serialNumber", "")).lower().lstrip("0") or "0"
        not_after = ssl.cert_time_to_seconds(cert["notAfter"]) if cert.get("notAfter") else float("inf")
        return cls(ids, serial, not_after, subject)


@dataclass(frozen=True, slots=True)
class TLSConnection:
    """One TLS connection to the public listener."""

    node_ca: str | None
    """The ``nodeCertCa`` PEM the handshake verified client certificates against; None when
    the listener did not ask for one (``nodeMtls`` off). A change of CA after the handshake
    makes the connection stale for the join paths."""
    peer: PeerCert | None
    """The verified client certificate, or None when the client sent none."""


def connection_of(scope: Mapping[str, Any]) -> TLSConnection | None:
    """The request's TLS connection, or None for a plain one."""
    extensions = scope.get("extensions")
    return extensions.get(SCOPE_KEY) if extensions else None


def spiffe_node_ids(uris: Iterable[str]) -> tuple[str, ...]:
    """Node ids named by SPIFFE URIs of the opod node shape; other URIs are ignored."""
    out: list[str] = []
    for uri in uris:
        match = _SPIFFE_NODE.fullmatch(uri)
        if match and match.group(2) not in out:
            out.append(match.group(2))
    return tuple(out)
