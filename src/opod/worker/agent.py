"""The worker → leader half of the node protocol: register, then a heartbeat every 5 s.

A heartbeat answered 404 means the leader does not know this node (it restarted
with an empty store, or forgot it): register again. A refused token is said
plainly. On shutdown the last heartbeat declares the engine stopped, so the
leader stops routing here at once instead of waiting for silence.

To a TLS leader (an ``https://`` URL) the agent trusts exactly ``leader_ca``
(``OPOD_LEADER_CA``) when given, and presents its client certificate when it
has one; every call is still signed with the token, which the leader needs to
sign its own calls to this worker. A 421 answer means the connection predates
the leader's current node CA: the call is made again at once on a new one. A
leader that does not accept the certificate closes the connection during the
handshake (Python's ssl cannot let it through to the token), so the agent then
tries without it, and says so.

The inventory (opod's addition, docs/contract.md) goes with the registration and,
when it changed since (models on disk, warnings), with the next heartbeat.
:meth:`Agent.restart` starts the agent over: new capabilities (the inventory read
again), new connections, a new registration; the engines and the worker's
listener are not touched, so they keep serving throughout.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from opod.contract import nodeapi
from opod.http import cpu
from opod.http.tls.client import worker_context
from opod.security.signer import Signer
from opod.worker import inventory
from opod.worker.engines import EngineManager
from opod.worker.hostload import HostLoadReader

log = logging.getLogger("opod.worker")

HEARTBEAT_EVERY = 5.0
MAX_BACKOFF = 15.0
PROVISION_EVERY = 60.0
"""Seconds between two looks at which engines the worker can run (an Ollama started, a package installed)."""


class TokenRefused(Exception):
    """The leader refused this worker's token; joining again needs a valid one."""


class Agent:
    def __init__(
        self,
        *,
        leader_url: str,
        node_id: str,
        token: str,
        boot_id: str,
        address: str,
        capabilities: nodeapi.Capabilities,
        manager: EngineManager,
        leader_ca: str | None = None,
        client_cert: str | Path | None = None,
        client_key: str | Path | None = None,
        ssl_context: ssl.SSLContext | None = None,
        kick: asyncio.Event | None = None,
        host_load: HostLoadReader | None = None,
        provision: Callable[[], Awaitable[list[nodeapi.EngineInstall]]] | None = None,
        keep_apart: bool = False,
    ) -> None:
        """``leader_ca``: path or PEM of the one certificate trusted for an https leader
        (``OPOD_LEADER_CA``); ``client_cert``/``client_key``: this worker's certificate, whose
        URI SAN is ``spiffe://<trust domain>/opod/node/<node_id>``; ``ssl_context``: a ready
        context instead of those (opod up's own worker pins the listener's certificate);
        ``kick``: set to ask for a heartbeat now, by the engines and processes built before
        the agent (so they hold this event, not the agent); ``host_load``: the host's load, sent
        with each heartbeat; ``provision``: which engines the worker can run, asked at registration
        and every ``PROVISION_EVERY`` seconds; ``keep_apart``: the worker has its process to itself, which keeps off
        leaders' event-loop CPUs on this machine, asked at each registration (``opod.http.cpu.keep_worker_apart``)."""
        self.leader_url = leader_url.rstrip("/")
        self.node_id = node_id
        self.boot_id = boot_id
        self.address = address
        self.capabilities = capabilities
        self.manager = manager
        self.signer = Signer(node_id, token)
        self.registered = asyncio.Event()
        self.keep_apart = keep_apart
        self._kick = kick if kick is not None else asyncio.Event()
        self._contexts = _contexts(self.leader_url, leader_ca, client_cert, client_key, ssl_context)
        """True → the context presenting the certificate; False → the same without it."""
        self.has_cert = True in self._contexts and False in self._contexts
        self._with_cert = self.has_cert
        """Whether calls present the certificate now; False after the leader refused it at the handshake."""
        self._sessions: dict[bool, aiohttp.ClientSession] = {}
        self._trusts_one = bool(leader_ca)
        self._reported: nodeapi.InventoryReport | None = None
        """The inventory the leader has from this agent (its registration or a later heartbeat)."""
        self._pending: nodeapi.InventoryReport | None = None
        self.disk_free_gb: Callable[[], int] = lambda: inventory.disk_free_gb(manager.home)
        """Free GiB now; a declared inventory that states it keeps that figure."""
        self.restarts = 0
        self.host_load = host_load
        self._survey = provision
        self._provision: list[nodeapi.EngineInstall] | None = None
        self._surveyed_at = float("-inf")
        self.on_orders: list[Callable[[nodeapi.HeartbeatResponse], None]] = []
        """Each is given every accepted heartbeat's answer: the release and engine builds the operator set
        for this node, to act on when they differ from what runs (the answer repeats them, so a restarted
        worker converges too)."""

    def restart(self, capabilities: nodeapi.Capabilities) -> None:
        """Start the agent over with ``capabilities``: register again on new connections at the next turn."""
        self.capabilities = capabilities
        self.registered.clear()
        self._reported = None
        self.restarts += 1
        for session in self._sessions.values():
            # Closed by the loop's next call, not here: a call in flight finishes on its own session.
            asyncio.ensure_future(session.close())
        self._sessions = {}
        self.kick()
        log.info("agent restarting: registering again with the inventory read anew (engines keep serving)")

    def _inventory_now(self) -> nodeapi.InventoryReport | None:
        base = self.capabilities.inventory
        if base is None:
            return None
        update: dict[str, object] = {"models_on_disk": inventory.models_on_disk(self.manager.home)}
        if self._provision is not None:
            update["provision"] = self._provision
        return base.model_copy(update=update)

    async def _look_at_engines(self, *, now: bool = False) -> None:
        """Ask again which engines this worker can run, at registration or when the last answer is old."""
        loop = asyncio.get_running_loop()
        if self._survey is None or (not now and loop.time() - self._surveyed_at < PROVISION_EVERY):
            return
        self._surveyed_at = loop.time()
        try:
            self._provision = await self._survey()
        except Exception as err:  # a broken look must not stop registration or heartbeats
            log.warning("could not tell which engines this worker can run: %s", err)

    def kick(self) -> None:
        """Send a heartbeat now (an engine changed state)."""
        self._kick.set()

    def survey_soon(self) -> None:
        """Look at the engines anew for the next heartbeat, and send it now (a build was chosen or installed)."""
        self._surveyed_at = float("-inf")
        self.kick()

    def _session(self, with_cert: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(with_cert)
        if session is None or session.closed:
            context = self._contexts.get(with_cert, self._contexts.get(True))
            connector = aiohttp.TCPConnector(ssl=context if context is not None else True)
            session = self._sessions[with_cert] = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=10)
            )
        return session

    async def _attempt(self, path: str, body: nodeapi.WireModel, with_cert: bool) -> tuple[int, str]:
        headers = {"Content-Type": "application/json", **self.signer.headers("POST", path)}  # a fresh nonce each try
        async with self._session(with_cert).post(self.leader_url + path, data=body.to_json(), headers=headers) as resp:
            return resp.status, await resp.text()

    async def _post(self, path: str, body: nodeapi.WireModel) -> tuple[int, str]:
        status, text = await self._send(path, body)
        if status == 421:
            # The connection's handshake predates the leader's node CA; the leader closed it.
            status, text = await self._send(path, body)
        return status, text

    async def _send(self, path: str, body: nodeapi.WireModel) -> tuple[int, str]:
        if not self._with_cert:
            status, text = await self._attempt(path, body, False)
            if status in (401, 403) and self.has_cert:
                # Refused without the certificate: perhaps the leader accepts it by now.
                try:
                    answer = await self._attempt(path, body, True)
                except aiohttp.ClientConnectionError:
                    return status, text
                self._with_cert = True
                return answer
            return status, text
        try:
            return await self._attempt(path, body, True)
        except aiohttp.ClientConnectorCertificateError:
            raise  # this worker does not trust the leader: no fallback
        except aiohttp.ClientConnectionError as err:
            # Either the network failed, or the leader ended the handshake over this certificate.
            # Asking once without it tells them apart.
            first_error = err
        try:
            status, text = await self._attempt(path, body, False)
        except (aiohttp.ClientError, OSError):
            raise first_error from None
        if status in (401, 403):
            # Refused without it: the certificate is needed; one more try with it.
            try:
                return await self._attempt(path, body, True)
            except aiohttp.ClientConnectionError:
                raise TokenRefused(
                    f"the leader at {self.leader_url} refused this worker: {_message(text)}; and it ends the TLS handshake "
                    "when this worker presents its client certificate (is the certificate signed by the leader's nodeCertCa, "
                    "unexpired, and for this node?)"
                ) from None
        log.warning(
            "the leader at %s ends the TLS handshake when this worker presents its client certificate, but answers "
            "without it: it does not accept the certificate (is it signed by the leader's nodeCertCa, and unexpired?); "
            "going on with the join token alone",
            self.leader_url,
        )
        self._with_cert = False
        return status, text

    async def register(self) -> None:
        await self._look_at_engines(now=True)
        report = self._inventory_now()
        caps = self.capabilities if report is None else self.capabilities.model_copy(update={"inventory": report})
        req = nodeapi.RegisterRequest(
            id=self.node_id,
            hostname=self.capabilities.hostname,
            os=self.capabilities.os,
            arch=self.capabilities.arch,
            ram_gb=self.capabilities.ram_gb,
            address=self.address,
            hardware_json=nodeapi.encode_hardware(caps),
            boot_id=self.boot_id,
        )
        self._with_cert = self.has_cert  # each registration tries the certificate again
        status, text = await self._post(nodeapi.PATH_REGISTER, req)
        if status in (401, 403):
            raise TokenRefused(f"the leader at {self.leader_url} refused this worker: {_message(text)}")
        if status != 200:
            raise RuntimeError(f"register answered HTTP {status}: {_message(text)}")
        self._reported = report
        self.registered.set()
        log.info("registered with %s as %s (listening on %s)", self.leader_url, self.node_id, self.address)
        if self.keep_apart:
            cpu.keep_worker_apart()  # a leader on this machine has pinned its loop by now

    async def heartbeat_body(self, *, goodbye: bool = False) -> nodeapi.Heartbeat:
        if goodbye:
            return nodeapi.Heartbeat(
                id=self.node_id,
                loaded_models=[],
                boot_id=self.boot_id,
                engine=nodeapi.EngineState(state="stopped", since=_now(), detail="worker stopped"),
            )
        self.manager.reconcile_adapters()
        sample, slots = await self.manager.sample()
        await self._look_at_engines()
        report = self._inventory_now()
        self._pending = report if report is not None and report != self._reported else None
        return nodeapi.Heartbeat(
            id=self.node_id,
            loaded_models=self.manager.loaded_models(),
            boot_id=self.boot_id,
            sleeping=self.manager.sleeping,
            load=sample.to_engine_load() if sample is not None else None,
            engine=self.manager.engine_state(),
            slots=slots,
            load_errors=self.manager.load_errors() or None,
            load_progress=self.manager.load_progress() or None,
            engine_urls=self.manager.engine_urls() or None,
            model_engines=self.manager.model_engines() or None,
            model_context=self.manager.model_context() or None,
            disk_free_gb=self.disk_free_gb(),
            kv_blocks=self.manager.kv_blocks(),
            inventory=self._pending,
            host_load=self.host_load.read() if self.host_load is not None else None,
            replicas=self.manager.replicas() or None,
        )

    async def beat(self) -> bool:
        """One heartbeat. False when the leader does not know this node (register again);
        raises :class:`TokenRefused` when it refuses this worker, ``RuntimeError`` on another answer."""
        body = await self.heartbeat_body()
        status = 0
        try:
            status, text = await self._post(nodeapi.PATH_HEARTBEAT, body)
        finally:
            if status != 200 and body.kv_blocks is not None:
                self.manager.kv_lost()  # the leader may not have applied this cache batch: the next one starts over
        if status == 404:
            log.info("the leader does not know this node (%s); registering again", _message(text))
            self.registered.clear()
            return False
        if status in (401, 403):
            self.registered.clear()
            raise TokenRefused(f"heartbeat refused: {_message(text)}")
        if status != 200:
            raise RuntimeError(f"heartbeat answered HTTP {status}: {_message(text)}")
        if body.inventory is not None:
            self._reported = body.inventory
        if self.on_orders:
            try:
                orders = nodeapi.HeartbeatResponse.model_validate_json(text)
            except ValueError as err:
                log.warning("the leader's heartbeat answer is not a HeartbeatResponse: %s", err)
            else:
                for heard in self.on_orders:
                    heard(orders)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Register (retrying with back-off), then heartbeat until ``stop`` is set."""
        backoff = 1.0
        while not stop.is_set():
            # Cleared before the heartbeat is built: a kick while it is sent (cache changes) asks for the next one.
            self._kick.clear()
            delivered = False
            try:
                if not self.registered.is_set():
                    await self.register()
                if not await self.beat():
                    continue
                backoff = 1.0
                wait = HEARTBEAT_EVERY
                delivered = True
            except TokenRefused:
                raise
            except aiohttp.ClientConnectorCertificateError as err:
                log.error(
                    "the leader at %s is not trusted: its certificate does not verify against %s (%s); retrying in %.0fs",
                    self.leader_url,
                    "OPOD_LEADER_CA" if self._trusts_one else "the system's trust store (set OPOD_LEADER_CA)",
                    err.certificate_error,
                    backoff,
                )
                wait = backoff
                backoff = min(backoff * 2, MAX_BACKOFF)
            except (aiohttp.ClientError, OSError, RuntimeError, TimeoutError) as err:
                if stop.is_set():
                    break  # cut off because this process is stopping (opod up stops its leader too): nothing to retry
                log.warning(
                    "leader at %s unreachable (%s); retrying in %.0fs",
                    self.leader_url,
                    err or type(err).__name__,
                    backoff,
                )
                wait = backoff
                backoff = min(backoff * 2, MAX_BACKOFF)
            if not delivered:
                self._kick.clear()  # kicks do not cut a back-off short
            try:
                await asyncio.wait_for(_first(stop, self._kick), timeout=wait)
            except TimeoutError:
                pass

    async def goodbye(self) -> None:
        """The last heartbeat: the engine is stopped and nothing is loaded."""
        if not self.registered.is_set():
            return
        try:
            await asyncio.wait_for(
                self._post(nodeapi.PATH_HEARTBEAT, await self.heartbeat_body(goodbye=True)), timeout=3
            )
        except (aiohttp.ClientError, OSError, TimeoutError, TokenRefused) as err:
            log.info("could not say goodbye to the leader: %s", err or type(err).__name__)
        finally:
            await self.close()

    async def close(self) -> None:
        if self.host_load is not None:
            self.host_load.close()
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()


async def _first(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _contexts(
    leader_url: str,
    leader_ca: str | None,
    cert: str | Path | None,
    key: str | Path | None,
    given: ssl.SSLContext | None,
) -> dict[bool, ssl.SSLContext]:
    """The TLS contexts for the leader: with the certificate (True) and without it (False)."""
    if not leader_url.startswith("https://"):
        if leader_ca or cert or given is not None:
            log.warning(
                "%s is plain http: OPOD_LEADER_CA and the client certificate are not used; give an https:// URL",
                leader_url,
            )
        return {}
    if given is not None:
        return {True: given}
    contexts = {True: worker_context(leader_ca, cert, key)}
    if cert:
        contexts[False] = worker_context(leader_ca)
    return contexts


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(text: str) -> str:
    import json

    try:
        body = json.loads(text)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:300]
