"""The HTTPS listener itself: the peer in the ASGI scope, under uvloop as ``opod up`` runs it, the
client-certificate CA swapped per new connection, the certificate files reloaded, a bad pair named."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
import uvloop

from opod.http.serving import Listener, bind, serve
from opod.http.tls.peer import connection_of
from opod.http.tls.policy import NodeMtls
from opod.http.tls.server import LeaderTLS, TLSConfigError
from tests.http.tls.certs import Certs, Pair


async def echo_tls(scope, receive, send) -> None:
    """Answers what the listener put in the scope about the TLS connection."""
    tls = connection_of(scope)
    body = {"tls": tls is not None}
    if tls is not None:
        body["asked"] = tls.node_ca is not None
        body["peer"] = None if tls.peer is None else {"ids": list(tls.peer.node_ids), "serial": tls.peer.serial}
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def fetch(url: str, ca: Path, cert: Pair | None = None) -> dict:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    with urllib.request.urlopen(url, context=context if url.startswith("https") else None, timeout=5) as resp:
        return json.loads(resp.read())


async def serve_echo(tls: LeaderTLS | None, check) -> None:
    stop = asyncio.Event()
    listener = Listener(echo_tls, bind("127.0.0.1", 0, "test"), "test", ssl=tls.context if tls else None)
    task = asyncio.create_task(serve([listener], stop))
    try:
        await asyncio.to_thread(check, f"{listener.scheme}://127.0.0.1:{listener.port}/")
    finally:
        stop.set()
        await task


def test_the_peer_reaches_the_app_under_uvloop(certs: Certs) -> None:
    policy = NodeMtls("allow", certs.ca.pem, enforced=True)
    tls = LeaderTLS(certs.leader.cert, certs.leader.key, lambda: policy)

    def check(url: str) -> None:
        assert fetch(url, certs.ca.cert) == {"tls": True, "asked": True, "peer": None}
        assert fetch(url, certs.ca.cert, certs.workers["n_alpha"]) == {
            "tls": True,
            "asked": True,
            "peer": {"ids": ["n_alpha"], "serial": "a01"},
        }

    uvloop.run(serve_echo(tls, check))


async def test_a_plain_listener_carries_no_tls(certs: Certs) -> None:
    def check(url: str) -> None:
        assert fetch(url, certs.ca.cert) == {"tls": False}

    await serve_echo(None, check)


async def test_the_client_ca_follows_the_policy_for_new_connections(certs: Certs) -> None:
    policies = {"now": NodeMtls()}
    tls = LeaderTLS(certs.leader.cert, certs.leader.key, lambda: policies["now"])
    delta = certs.other_workers["n_delta"]

    def check(url: str) -> None:
        # off: no certificate is asked for, so none arrives even from a worker that has one.
        assert fetch(url, certs.ca.cert, certs.workers["n_alpha"])["peer"] is None
        policies["now"] = NodeMtls("allow", certs.other_ca.pem, enforced=True)
        assert fetch(url, certs.ca.cert, delta)["peer"] == {"ids": ["n_delta"], "serial": "b01"}
        with pytest.raises(OSError):  # a certificate of a CA no longer (or not) held ends the handshake
            fetch(url, certs.ca.cert, certs.workers["n_alpha"])
        policies["now"] = NodeMtls("allow", certs.ca.pem, enforced=True)
        assert fetch(url, certs.ca.cert, certs.workers["n_alpha"])["peer"]["ids"] == ["n_alpha"]
        # Held but not enforced (no listener verifying, as the auth file knows it): nothing is asked.
        policies["now"] = NodeMtls("allow", certs.ca.pem, enforced=False)
        assert fetch(url, certs.ca.cert, certs.workers["n_alpha"])["asked"] is False

    await serve_echo(tls, check)


async def test_renewed_certificate_files_are_served_without_a_restart(certs: Certs, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.pem", tmp_path / "tls.key"
    shutil.copy(certs.leader.cert, cert)
    shutil.copy(certs.leader.key, key)
    tls = LeaderTLS(cert, key)

    def served_by(url: str) -> str:
        context = ssl.create_default_context(cafile=str(certs.other_ca.cert))
        context.load_verify_locations(cafile=str(certs.ca.cert))
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            return conn.getpeercert()["serialNumber"]

    def check(url: str) -> None:
        assert served_by(url) == "1001"
        time.sleep(0.05)
        shutil.copy(certs.other_leader.cert, cert)
        shutil.copy(certs.other_leader.key, key)
        os.utime(cert), os.utime(key)
        time.sleep(1.1)  # the files are looked at once a second
        assert served_by(url) == "2001"

    await serve_echo(tls, check)


def test_a_bad_pair_is_named(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match="cannot read .*absent.pem.*OPOD_TLS_CERT"):
        LeaderTLS(tmp_path / "absent.pem", certs.leader.key)
    with pytest.raises(TLSConfigError, match="do not load as a PEM certificate and its private key"):
        LeaderTLS(certs.leader.cert, certs.workers["n_alpha"].key)
