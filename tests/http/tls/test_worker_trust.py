"""A worker calling a TLS leader trusts exactly ``OPOD_LEADER_CA`` (a path or the PEM itself), nothing else."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from opod.http.tls.client import TLSClientError, worker_context
from tests.http.tls.conftest import TLSLeader


async def test_a_worker_trusting_another_ca_refuses_the_leader(
    tls_leader: TLSLeader, caplog: pytest.LogCaptureFixture
) -> None:
    agent = tls_leader.agent("n_plain", leader_ca=str(tls_leader.certs.other_ca.cert))
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await agent.register()
        # Running, it says why and keeps trying rather than joining anyway.
        stop = asyncio.Event()
        with caplog.at_level(logging.ERROR, logger="opod.worker"):
            task = asyncio.create_task(agent.run(stop))
            await asyncio.sleep(0.5)
            stop.set()
            await task
    finally:
        await agent.close()
    assert any("is not trusted: its certificate does not verify against OPOD_LEADER_CA" in m for m in caplog.messages)
    assert tls_leader.leader.fleet.get("n_plain") is None


async def test_the_leader_ca_given_as_pem_text(tls_leader: TLSLeader) -> None:
    agent = tls_leader.agent("n_plain", leader_ca=tls_leader.certs.ca.pem)
    try:
        await agent.register()
    finally:
        await agent.close()


async def test_the_leaders_own_certificate_as_the_one_trusted(tls_leader: TLSLeader) -> None:
    agent = tls_leader.agent("n_plain", leader_ca=str(tls_leader.certs.leader.cert))
    try:
        await agent.register()
    finally:
        await agent.close()


async def test_without_opod_leader_ca_the_system_store_decides(tls_leader: TLSLeader) -> None:
    # The test CA is in no system store, so the leader is refused.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=worker_context(None))) as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(tls_leader.url + "/healthz")


async def test_opod_up_s_own_worker_pins_the_listener_certificate(tls_leader: TLSLeader) -> None:
    connector = aiohttp.TCPConnector(ssl=tls_leader.tls.local_worker_context())
    async with aiohttp.ClientSession(connector=connector) as session, session.get(tls_leader.url + "/healthz") as resp:
        assert resp.status == 200


def test_unusable_settings_are_named(tmp_path, certs) -> None:
    with pytest.raises(TLSClientError, match="OPOD_LEADER_CA: cannot read"):
        worker_context(str(tmp_path / "absent.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(TLSClientError, match="OPOD_LEADER_CA"):
        worker_context(str(tmp_path / "junk.pem"))
    with pytest.raises(TLSClientError, match="needs both files"):
        worker_context(None, certs.workers["n_alpha"].cert)
    with pytest.raises(TLSClientError, match="do not load as a PEM certificate"):
        worker_context(None, certs.workers["n_alpha"].cert, certs.workers["n_beta"].key)
