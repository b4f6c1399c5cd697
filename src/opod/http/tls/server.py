"""The TLS context of the leader's public listener.

The listener is created once with one ``SSLContext``; the auth file's
``nodeCertCa`` can change while it serves, and Python cannot drop a CA from a
loaded context. So :class:`LeaderTLS` hands the server a context whose
``wrap_bio`` (what asyncio and uvloop call for each new connection) delegates to
a plain context built for the CA in force now, rebuilt when the CA, the mode
or the certificate files change. Connections already open keep the context of
their handshake; the join handlers notice when that is stale
(:mod:`opod.http.tls.identity`).

Client certificates are asked for (``CERT_OPTIONAL``) only while ``nodeMtls``
is ``allow`` or ``require``: ``/v1`` clients never need one, so ``require`` is
enforced by the join handlers, not by the handshake. One limit of Python's
``ssl``: a certificate the client does present is verified during the
handshake, so one not signed by ``nodeCertCa`` ends the connection rather than
falling back to the token; opod's worker then retries without it.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from opod.http.tls.policy import NodeMtls
from opod.http.tls.protocol import NODE_CA_ATTR

log = logging.getLogger("opod.http.tls")

FILES_CHECK_EVERY = 1.0
"""Seconds between looks at the certificate files' modification times (renewal without a restart)."""


class TLSConfigError(ValueError):
    """The listener's certificate or key cannot be used; the message names the file and the remedy."""


def _node_ca(policy: NodeMtls) -> str | None:
    """The CA to verify worker certificates against, or None when certificates are not asked for."""
    if policy.enforced and policy.mode in ("allow", "require") and policy.ca_pem:
        return policy.ca_pem
    return None


class _SwitchingContext(ssl.SSLContext):
    """The context given to the server: each new connection gets ``owner.current()``'s."""

    _owner: LeaderTLS

    def __new__(cls, owner: LeaderTLS) -> Self:
        # SSLContext takes the protocol in __new__; the owner is for __init__.
        return super().__new__(cls, ssl.PROTOCOL_TLS_SERVER)

    def __init__(self, owner: LeaderTLS) -> None:
        self._owner = owner

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return self._owner.current().wrap_bio(
            incoming, outgoing, server_side=server_side, server_hostname=server_hostname, session=session
        )

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        return self._owner.current().wrap_socket(
            sock,
            server_side=server_side,
            do_handshake_on_connect=do_handshake_on_connect,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=server_hostname,
            session=session,
        )


class LeaderTLS:
    """HTTPS for the public listener, asking workers for certificates as the auth file says.

    ``policy`` returns the auth file's current :class:`NodeMtls` (``AuthFile.node_mtls``);
    pass ``context`` to :class:`opod.http.serving.Listener` as ``ssl``.
    """

    def __init__(self, certfile: str | Path, keyfile: str | Path, policy: Callable[[], NodeMtls] = NodeMtls) -> None:
        self.certfile = str(Path(certfile).expanduser())
        self.keyfile = str(Path(keyfile).expanduser())
        self.policy = policy
        self._files = self._stat_files()
        self._ca = _node_ca(policy())
        self._current = self._build(self._ca)  # a bad pair is an error at start-up, not at the first client
        self._checked = time.monotonic()
        self._failed: tuple[str | None, tuple[int, int]] | None = None
        self.context: ssl.SSLContext = _SwitchingContext(self)

    # --- building ---------------------------------------------------------------

    def _stat_files(self) -> tuple[int, int]:
        try:
            return (os.stat(self.certfile).st_mtime_ns, os.stat(self.keyfile).st_mtime_ns)
        except OSError as err:
            raise TLSConfigError(
                f"cannot read {err.filename}: {err.strerror}; OPOD_TLS_CERT and OPOD_TLS_KEY name the listener's PEM certificate and key"
            ) from None

    def _build(self, node_ca: str | None) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
        except (FileNotFoundError, PermissionError, IsADirectoryError) as err:
            raise TLSConfigError(
                f"cannot read {err.filename}: {err.strerror}; OPOD_TLS_CERT and OPOD_TLS_KEY name the listener's PEM certificate and key"
            ) from None
        except ssl.SSLError as err:
            raise TLSConfigError(
                f"{self.certfile} and {self.keyfile} do not load as a PEM certificate and its private key ({err.reason or err}); "
                "give the certificate (with its chain) in OPOD_TLS_CERT and its unencrypted key in OPOD_TLS_KEY"
            ) from None
        if node_ca is not None:
            context.load_verify_locations(cadata=node_ca)
            context.verify_mode = ssl.CERT_OPTIONAL
        setattr(context, NODE_CA_ATTR, node_ca)
        return context

    # --- serving ------------------------------------------------------------------

    def current(self) -> ssl.SSLContext:
        """The context for a new connection: rebuilt when the node CA or the certificate files changed."""
        ca = _node_ca(self.policy())
        files = self._files
        now = time.monotonic()
        if now - self._checked >= FILES_CHECK_EVERY:
            self._checked = now
            try:
                files = self._stat_files()
            except TLSConfigError as err:
                log.error("keeping the listener's certificate: %s", err)
        if (ca == self._ca and files == self._files) or (ca, files) == self._failed:
            return self._current
        try:
            context = self._build(ca)
        except (TLSConfigError, ssl.SSLError, ValueError) as err:
            # Files half replaced, or a CA that does not load: keep serving with what worked;
            # the same state is not tried again, a further change is.
            log.error("TLS context not rebuilt, keeping the previous one: %s", err)
            self._failed = (ca, files)
            return self._current
        if files != self._files:
            log.info("the public listener's certificate was reloaded from %s", self.certfile)
        if ca != self._ca:
            log.info(
                "the public listener now %s",
                "asks workers for certificates" if ca else "asks for no client certificate",
            )
        self._current, self._ca, self._files = context, ca, files
        return self._current

    def local_worker_context(self) -> ssl.SSLContext:
        """For ``opod up``'s own worker, which reaches the listener on 127.0.0.1: trust this
        listener's certificate (the first in the file, not its chain) and nothing else. The
        certificate may name the public host rather than 127.0.0.1, so the name is not
        checked; pinning the exact certificate is the stronger check. The pin is the
        certificate of now: after renewing the files, restart ``opod up``."""
        text = Path(self.certfile).read_text()
        end = "-----END CERTIFICATE-----"
        start = text.find("-----BEGIN CERTIFICATE-----")
        if start < 0 or end not in text[start:]:
            raise TLSConfigError(
                f"{self.certfile} holds no PEM certificate; OPOD_TLS_CERT names the listener's certificate"
            )
        leaf = text[start : text.index(end, start) + len(end)] + "\n"
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf as its own trust anchor
        context.load_verify_locations(cadata=leaf)
        return context
