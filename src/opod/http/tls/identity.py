"""Which node a worker's client certificate proves, under the auth file's ``nodeMtls``.

:func:`certificate_identity` answers for one register or heartbeat: the node id
when a certificate authenticates the caller, None when the join token has to
decide, or :class:`CertRefused` when the certificate itself must be refused
(revoked, naming no node or several) or the connection must be made again
(its handshake used a node CA the auth file no longer holds, or the
certificate expired since).
"""

from __future__ import annotations

import time

from opod.http.tls.peer import TLSConnection
from opod.http.tls.policy import NodeMtls

SAN_SHAPE = "spiffe://<trust domain>/opod/node/<id>"


class CertRefused(Exception):
    """A certificate that may not stand for a node: ``status`` (403, or 421 = reconnect) and what to do."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        self.status = status
        self.kind = kind
        super().__init__(message)


def certificates_checked(policy: NodeMtls) -> bool:
    """Whether certificates count at all: a mode other than off, on a leader that verifies them."""
    return policy.enforced and policy.mode in ("allow", "require")


def certificate_identity(policy: NodeMtls, tls: TLSConnection | None, *, now: float | None = None) -> str | None:
    """The node id the connection's certificate proves, or None (no usable certificate: the token decides)."""
    if not certificates_checked(policy) or tls is None:
        return None
    if tls.node_ca != policy.ca_pem:
        # Verified against another CA (or not asked for at all): only a new handshake can tell.
        raise CertRefused(
            421,
            "this connection was opened before the leader's node CA changed (auth file nodeCertCa); "
            "retry on a new connection",
            "stale_connection",
        )
    cert = tls.peer
    if cert is None:
        return None
    if (now if now is not None else time.time()) >= cert.not_after:
        raise CertRefused(
            421,
            "the client certificate of this connection has expired since it was opened; retry on a new connection "
            "(with a renewed certificate)",
            "stale_connection",
        )
    if policy.is_revoked(cert.serial):
        named = f" of node {cert.node_ids[0]!r}" if len(cert.node_ids) == 1 else ""
        raise CertRefused(
            403,
            f"the client certificate{named} (serial {cert.serial}) is revoked by the auth file (revokedCerts); "
            "give the worker a newly issued certificate",
            "forbidden",
        )
    if len(cert.node_ids) > 1:
        raise CertRefused(
            403,
            f"the client certificate names several nodes ({', '.join(cert.node_ids)}); a worker certificate "
            f"needs exactly one URI SAN {SAN_SHAPE}",
            "forbidden",
        )
    if not cert.node_ids:
        if policy.mode == "require":
            raise CertRefused(
                403,
                f"the client certificate ({cert.subject or 'no subject'}) names no node; a worker certificate "
                f"needs a URI SAN {SAN_SHAPE}",
                "forbidden",
            )
        return None  # signed by the CA but not a node certificate: in allow, the token decides
    return cert.node_ids[0]


def required_refusal() -> str:
    """The answer to a token-only join when the auth file says ``require``."""
    return (
        "this leader requires worker certificates (auth file nodeMtls: require): connect over HTTPS with a client "
        f"certificate signed by the auth file's nodeCertCa whose URI SAN is {SAN_SHAPE}, "
        "or have the operator set nodeMtls to allow"
    )
