"""Workers joining a TLS leader under each ``nodeMtls`` mode, with real certificates.

The auth file is rewritten while the leader serves: the mode, the node CA and
the revoked serials take effect without a restart, on connections already
open too.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

from opod.contract import nodeapi
from opod.contract.nodeauth import HEADER, sign
from opod.worker.agent import TokenRefused
from tests.http.tls.conftest import TLSLeader, auth_body, running_leader


def register_body(node_id: str) -> str:
    return nodeapi.RegisterRequest(
        id=node_id, hostname=node_id, os="linux", arch="amd64", ram_gb=1, address="127.0.0.1:9", boot_id="b1"
    ).to_json()


async def post(
    session: aiohttp.ClientSession, url: str, path: str, body: str, header: str | None = None
) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers[HEADER] = header
    async with session.post(url + path, data=body, headers=headers) as resp:
        return resp.status, json.loads(await resp.text())


async def joins(tls_leader: TLSLeader, agent, caplog: pytest.LogCaptureFixture) -> str:  # type: ignore[no-untyped-def]
    """Register and heartbeat once; what the leader logged after "node N registered from ": address, engine, credentials."""
    with caplog.at_level(logging.INFO, logger="opod.leader"):
        try:
            await agent.register()
            assert await agent.beat()
        finally:
            await agent.close()
    assert tls_leader.leader.fleet.get(agent.node_id) is not None
    [line] = [m for m in caplog.messages if m.startswith(f"node {agent.node_id} registered from ")]
    return line.split(" registered from ", 1)[1]


async def test_v1_over_https_needs_no_client_certificate(tls_leader: TLSLeader) -> None:
    await tls_leader.set_auth("allow")
    key = tls_leader.leader.new_admin_key
    async with (
        tls_leader.client() as session,
        session.get(tls_leader.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["object"] == "list"


async def test_allow_a_certificate_worker_registers_and_heartbeats(
    tls_leader: TLSLeader, caplog: pytest.LogCaptureFixture
) -> None:
    await tls_leader.set_auth("allow")
    # opod's worker signs as well: the certificate names the node, the token is what the leader signs back with.
    assert (
        await joins(tls_leader, tls_leader.agent("n_alpha", tls_leader.certs.workers["n_alpha"]), caplog)
        == "127.0.0.1:9 (engine sim, by certificate+token)"
    )


async def test_allow_a_certificate_alone_authenticates(tls_leader: TLSLeader) -> None:
    await tls_leader.set_auth("allow")
    async with tls_leader.client(tls_leader.certs.workers["n_beta"]) as session:
        status, body = await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_beta"))
        assert (status, body) == (200, {"status": "registered", "id": "n_beta"})
        hb = nodeapi.Heartbeat(id="n_beta", loaded_models=[], boot_id="b1").to_json()
        assert (await post(session, tls_leader.url, nodeapi.PATH_HEARTBEAT, hb))[0] == 200
    async with tls_leader.client() as session:  # the same call with neither credential
        status, body = await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_beta"))
        assert status == 401


async def test_allow_a_certificate_naming_another_node_is_refused(tls_leader: TLSLeader) -> None:
    await tls_leader.set_auth("allow")
    agent = tls_leader.agent("n_alpha", tls_leader.certs.workers["n_beta"])
    try:
        with pytest.raises(TokenRefused, match="'n_beta'.*'n_alpha'"):
            await agent.register()
    finally:
        await agent.close()
    async with tls_leader.client(tls_leader.certs.workers["n_beta"]) as session:
        status, body = await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_alpha"))
    assert status == 403
    assert body["error"]["message"] == "the body names node 'n_alpha' but the client certificate names node 'n_beta'"
    assert tls_leader.leader.fleet.get("n_alpha") is None


async def test_allow_a_revoked_serial_is_refused(tls_leader: TLSLeader) -> None:
    gone = tls_leader.certs.workers["n_gone"]
    await tls_leader.set_auth("allow", revoked=[gone.serial])
    agent = tls_leader.agent("n_gone", gone)
    try:
        with pytest.raises(TokenRefused, match=f"serial {gone.serial}.* revoked"):
            await agent.register()
    finally:
        await agent.close()


async def test_allow_a_token_only_worker_still_joins(tls_leader: TLSLeader, caplog: pytest.LogCaptureFixture) -> None:
    await tls_leader.set_auth("allow")
    assert await joins(tls_leader, tls_leader.agent("n_plain"), caplog) == "127.0.0.1:9 (engine sim, by token)"


async def test_require_refuses_a_token_only_worker_and_takes_a_certificate_worker(tls_leader: TLSLeader) -> None:
    await tls_leader.set_auth("require")
    plain = tls_leader.agent("n_plain")
    alpha = tls_leader.agent("n_alpha", tls_leader.certs.workers["n_alpha"])
    try:
        with pytest.raises(TokenRefused, match="requires worker certificates"):
            await plain.register()
        await alpha.register()
        assert await alpha.beat()
    finally:
        await plain.close()
        await alpha.close()
    assert tls_leader.leader.fleet.get("n_plain") is None


async def test_require_still_takes_opod_ups_own_worker_on_loopback(
    tls_leader: TLSLeader, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker opod up runs beside its leader has no certificate; it signs with the local token only the leader holds.
    await tls_leader.set_auth("require")
    assert (
        await joins(tls_leader, tls_leader.agent("n_own", token=tls_leader.local_token), caplog)
        == "127.0.0.1:9 (engine sim, by token)"
    )


async def test_require_a_certificate_without_a_node_is_refused(tls_leader: TLSLeader) -> None:
    await tls_leader.set_auth("require")
    async with tls_leader.client(tls_leader.certs.no_node) as session:
        status, body = await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_alpha"))
    assert status == 403 and "spiffe://<trust domain>/opod/node/<id>" in body["error"]["message"]


async def test_off_ignores_certificates(tls_leader: TLSLeader) -> None:
    # No auth file: nodeMtls is off, the listener asks for no certificate, the token decides.
    agent = tls_leader.agent("n_alpha", tls_leader.certs.workers["n_beta"])
    try:
        await agent.register()
        assert await agent.beat()
    finally:
        await agent.close()


async def test_a_signature_sent_with_a_certificate_is_still_replay_checked(tls_leader: TLSLeader) -> None:
    await tls_leader.set_auth("allow")
    header = sign("n_alpha", tls_leader.token, "POST", nodeapi.PATH_REGISTER, nonce="feed.1")
    async with tls_leader.client(tls_leader.certs.workers["n_alpha"]) as session:
        assert (await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_alpha"), header))[0] == 200
        status, body = await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_alpha"), header)
    assert status == 403 and "replay" in body["error"]["message"]


async def test_revocations_and_the_ca_change_without_a_restart(
    tls_leader: TLSLeader, caplog: pytest.LogCaptureFixture
) -> None:
    certs = tls_leader.certs
    await tls_leader.set_auth("allow")
    alpha = tls_leader.agent("n_alpha", certs.workers["n_alpha"])
    try:
        await alpha.register()
        assert await alpha.beat()
        # Revoked while its connection is open: the next heartbeat is refused.
        await tls_leader.set_auth("allow", revoked=[certs.workers["n_alpha"].serial])
        with pytest.raises(TokenRefused, match="revoked"):
            await alpha.beat()
        # Lifted again.
        await tls_leader.set_auth("allow")
        await alpha.register()
        assert await alpha.beat()

        # The node CA changes to the other CA: n_alpha's certificate is no longer one the leader
        # trusts. Its open connection is sent away (421); on a new one the handshake refuses the
        # certificate, and in allow the worker goes on with its token.
        await tls_leader.set_auth("allow", ca=certs.other_ca.pem)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert await alpha.beat()
    finally:
        await alpha.close()
    said = "\n".join(caplog.messages)
    assert "opened before the leader's node CA changed" in said
    assert "does not accept the certificate" in said and "going on with the join token alone" in said
    async with tls_leader.client(certs.workers["n_alpha"]) as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_alpha"))
    # A certificate of the new CA is taken, with no restart.
    delta = certs.other_workers["n_delta"]
    async with tls_leader.client(delta) as session:
        status, body = await post(session, tls_leader.url, nodeapi.PATH_REGISTER, register_body("n_delta"))
    assert (status, body) == (200, {"status": "registered", "id": "n_delta"})


async def test_require_after_a_ca_change_refuses_the_old_certificate_plainly(tls_leader: TLSLeader) -> None:
    certs = tls_leader.certs
    await tls_leader.set_auth("require")
    alpha = tls_leader.agent("n_alpha", certs.workers["n_alpha"])
    try:
        await alpha.register()
        await tls_leader.set_auth("require", ca=certs.other_ca.pem)
        with pytest.raises(TokenRefused, match="requires worker certificates.*ends the TLS handshake"):
            await alpha.beat()
    finally:
        await alpha.close()


async def test_require_written_before_the_listener_is_judged_again(certs, tmp_path, monkeypatch) -> None:
    # A leader applies its files before the TLS listener exists; 'require' is refused then,
    # and taken once the listener checks certificates.
    async with running_leader(
        certs, tmp_path, monkeypatch, auth=auth_body("early", "require", certs.ca.pem)
    ) as running:
        for _ in range(50):
            if running.leader.snapshots.auth.revision == "early":
                break
            await asyncio.sleep(0.05)
        mtls = running.leader.snapshots.auth.node_mtls
        assert (mtls.mode, mtls.enforced) == ("require", True)
        plain = running.agent("n_plain")
        try:
            with pytest.raises(TokenRefused, match="requires worker certificates"):
                await plain.register()
        finally:
            await plain.close()
