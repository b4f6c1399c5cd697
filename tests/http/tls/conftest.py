"""A leader in this process with its public listener on HTTPS (loopback, a free port), and workers for it.

The leader is the real one (``opod.leader.Leader``) with the auth file watched
at a path the test writes; workers are the real ``Agent`` that ``opod join``
runs, given a certificate or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from opod.contract import nodeapi
from opod.http.serving import Listener, bind
from opod.http.tls.server import LeaderTLS
from opod.leader.leader import Leader, LeaderSettings
from opod.store.offloop import run_sync
from opod.worker.agent import Agent
from opod.worker.engines import EngineManager
from opod.worker.supervisor import Supervisor
from tests.http.tls.certs import Certs, Pair, available, make_all


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if not available():
        pytest.skip("the openssl command is needed to make the test certificates")
    return make_all(tmp_path_factory.mktemp("certs"))


def auth_body(revision: str, mode: str = "", ca: str = "", revoked: Iterable[str] = ()) -> dict:
    body: dict = {"revision": revision, "requireKeys": True, "keys": []}
    if mode:
        body["nodeMtls"] = mode
    if ca:
        body["nodeCertCa"] = ca
    if revoked:
        body["revokedCerts"] = list(revoked)
    return body


def write_atomically(path: Path, body: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


@dataclass
class TLSLeader:
    leader: Leader
    tls: LeaderTLS
    url: str
    auth_path: Path
    token: str
    certs: Certs
    home: Path
    local_token: str
    """The token opod up's own worker joins with; ``token`` is an ordinary node token."""
    _revisions: int = 0

    async def set_auth(self, mode: str = "", ca: str | None = None, revoked: Iterable[str] = ()) -> None:
        """Write the auth file (``ca`` defaults to the test CA) and wait until the leader holds it."""
        self._revisions += 1
        revision = f"r{self._revisions}"
        pem = self.certs.ca.pem if ca is None else ca
        write_atomically(self.auth_path, auth_body(revision, mode, pem if mode else "", revoked))
        for _ in range(100):
            if self.leader.snapshots.auth.revision == revision:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the leader did not apply auth revision {revision}: {self.leader.snapshots.status()}")

    def agent(
        self, node_id: str, cert: Pair | None = None, *, leader_ca: str | None = None, token: str | None = None
    ) -> Agent:
        manager = EngineManager(
            engine_id="sim", home=self.home / node_id, catalog=self.leader.catalog, supervisor=Supervisor()
        )
        return Agent(
            leader_url=self.url,
            node_id=node_id,
            token=token or self.token,
            boot_id=f"boot-{node_id}",
            address="127.0.0.1:9",
            capabilities=nodeapi.Capabilities(hostname=node_id, engine="sim"),
            manager=manager,
            leader_ca=str(self.certs.ca.cert) if leader_ca is None else leader_ca,
            client_cert=cert.cert if cert else None,
            client_key=cert.key if cert else None,
        )

    def client(self, cert: Pair | None = None) -> aiohttp.ClientSession:
        """A plain HTTPS client trusting the test CA, with a client certificate or without."""
        context = ssl.create_default_context(cafile=str(self.certs.ca.cert))
        if cert is not None:
            context.load_cert_chain(str(cert.cert), str(cert.key))
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))


@contextlib.asynccontextmanager
async def running_leader(
    certs: Certs, home: Path, monkeypatch: pytest.MonkeyPatch, auth: dict | None = None
) -> AsyncIterator[TLSLeader]:
    auth_path = home / "auth.json"
    home.mkdir(parents=True, exist_ok=True)
    if auth is not None:
        write_atomically(auth_path, auth)
    monkeypatch.setenv("OPOD_AUTH_FILE", str(auth_path))
    monkeypatch.setenv("OPOD_POLICY_FILE", "off")
    monkeypatch.setenv("OPOD_PLAN_FILE", "off")
    settings = LeaderSettings(
        home=home / "leader", default_models=False, tls_cert=certs.leader.cert, tls_key=certs.leader.key
    )
    leader = await run_sync(Leader.open, settings)
    assert leader.tls is not None, "a leader given a certificate serves HTTPS"
    stop = asyncio.Event()
    running = None
    try:
        public = Listener(leader.public_app(), bind("127.0.0.1", 0, "the leader"), "public", ssl=leader.tls.context)
        local_token = await run_sync(leader.access.local_worker_token)
        _, token = await leader.access.create("node", "workers joining in tests")
        running = asyncio.create_task(leader.run([public], stop))
        yield TLSLeader(
            leader, leader.tls, f"https://127.0.0.1:{public.port}", auth_path, token, certs, home, local_token
        )
    finally:
        stop.set()
        if running is not None:
            await running
        else:
            await leader.close()


@pytest.fixture
async def tls_leader(certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TLSLeader]:
    async with running_leader(certs, tmp_path, monkeypatch) as running:
        yield running
