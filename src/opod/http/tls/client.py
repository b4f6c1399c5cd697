"""A worker's TLS context for calling a leader over HTTPS.

``OPOD_LEADER_CA`` (CONTRACT.md §3) is the one certificate a worker trusts for
its leader, and then nothing else: not the system's store. It may be the
leader's CA or the leader's own (self-signed or not) certificate, given as a
file path or as the PEM text itself. Without it the system's trust store
applies. A worker that has a client certificate presents it, so a leader whose
auth file says ``nodeMtls: allow`` or ``require`` can know the node by it.
"""

from __future__ import annotations

import ssl
from pathlib import Path

PEM_MARK = "-----BEGIN CERTIFICATE-----"


class TLSClientError(ValueError):
    """A worker's TLS setting that cannot be used; the message names it and the remedy."""


def worker_context(
    leader_ca: str | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> ssl.SSLContext:
    """The context for HTTPS calls to the leader.

    ``leader_ca``: a path, or PEM text; when given, exactly that is trusted.
    ``cert``/``key``: the worker's client certificate and key (PEM), presented when given.
    """
    if leader_ca:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
        # A leaf given as the anchor (the leader's own certificate) is enough on its own.
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        try:
            if PEM_MARK in leader_ca:
                context.load_verify_locations(cadata=leader_ca)
            else:
                context.load_verify_locations(cafile=str(Path(leader_ca).expanduser()))
        except (ssl.SSLError, ValueError) as err:
            why = (err.reason if isinstance(err, ssl.SSLError) else None) or err
            raise TLSClientError(
                f"OPOD_LEADER_CA: not a PEM certificate ({why}); give the leader's CA certificate, -----BEGIN CERTIFICATE----- …"
            ) from None
        except OSError as err:  # after SSLError, which is an OSError too
            raise TLSClientError(
                f"OPOD_LEADER_CA: cannot read {leader_ca!r}: {err.strerror or err}; give the path of the leader's CA certificate (PEM) or the PEM itself"
            ) from None
    else:
        context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert or key:
        if not (cert and key):
            raise TLSClientError(
                "a worker's client certificate needs both files: the certificate (PEM) and its private key"
            )
        try:
            context.load_cert_chain(str(Path(cert).expanduser()), str(Path(key).expanduser()))
        except ssl.SSLError as err:
            raise TLSClientError(
                f"{cert} and {key} do not load as a PEM certificate and its unencrypted private key ({err.reason or err})"
            ) from None
        except OSError as err:
            raise TLSClientError(
                f"cannot read the worker's client certificate or key ({err.filename or cert}): {err.strerror or err}"
            ) from None
    return context
