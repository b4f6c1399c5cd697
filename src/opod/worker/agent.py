"""The worker → leader half of the node protocol: register, then a heartbeat every 5 s.

A heartbeat answered 404 means the leader does not know this node (it restarted
with an empty store, or forgot it): register again. A refused token is said
plainly. On shutdown the last heartbeat declares the engine stopped, so the
leader stops routing here at once instead of waiting for silence.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone, UTC

import aiohttp

from opod.contract import nodeapi
from opod.security.signer import Signer
from opod.worker.engines import EngineManager

log = logging.getLogger("opod.worker")

HEARTBEAT_EVERY = 5.0
MAX_BACKOFF = 15.0


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
    ) -> None:
        self.leader_url = leader_url.rstrip("/")
        self.node_id = node_id
        self.boot_id = boot_id
        self.address = address
        self.capabilities = capabilities
        self.manager = manager
        self.signer = Signer(node_id, token)
        self.registered = asyncio.Event()
        self._kick = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    def kick(self) -> None:
        """Send a heartbeat now (an engine changed state)."""
        self._kick.set()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self._session

    async def _post(self, path: str, body: nodeapi.WireModel) -> tuple[int, str]:
        headers = {"Content-Type": "application/json", **self.signer.headers("POST", path)}
        async with self.session.post(self.leader_url + path, data=body.to_json(), headers=headers) as resp:
            return resp.status, await resp.text()

    async def register(self) -> None:
        req = nodeapi.RegisterRequest(
            id=self.node_id,
            hostname=self.capabilities.hostname,
            os=self.capabilities.os,
            arch=self.capabilities.arch,
            ram_gb=self.capabilities.ram_gb,
            address=self.address,
            hardware_json=nodeapi.encode_hardware(self.capabilities),
            boot_id=self.boot_id,
        )
        status, text = await self._post(nodeapi.PATH_REGISTER, req)
        if status in (401, 403):
            raise TokenRefused(f"the leader at {self.leader_url} refused this worker: {_message(text)}")
        if status != 200:
            raise RuntimeError(f"register answered HTTP {status}: {_message(text)}")
        self.registered.set()
        log.info("registered with %s as %s (listening on %s)", self.leader_url, self.node_id, self.address)

    async def heartbeat_body(self, *, goodbye: bool = False) -> nodeapi.Heartbeat:
        if goodbye:
            return nodeapi.Heartbeat(
                id=self.node_id,
                loaded_models=[],
                boot_id=self.boot_id,
                engine=nodeapi.EngineState(state="stopped", since=_now(), detail="worker stopped"),
            )
        sample, slots = await self.manager.sample()
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
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Register (retrying with back-off), then heartbeat until ``stop`` is set."""
        backoff = 1.0
        while not stop.is_set():
            try:
                if not self.registered.is_set():
                    await self.register()
                status, text = await self._post(nodeapi.PATH_HEARTBEAT, await self.heartbeat_body())
                if status == 404:
                    log.info("the leader does not know this node (%s); registering again", _message(text))
                    self.registered.clear()
                    continue
                if status in (401, 403):
                    self.registered.clear()
                    raise TokenRefused(f"heartbeat refused: {_message(text)}")
                if status != 200:
                    raise RuntimeError(f"heartbeat answered HTTP {status}: {_message(text)}")
                backoff = 1.0
                wait = HEARTBEAT_EVERY
            except TokenRefused:
                raise
            except (aiohttp.ClientError, OSError, RuntimeError, TimeoutError) as err:
                log.warning("leader at %s unreachable (%s); retrying in %.0fs", self.leader_url, err or type(err).__name__, backoff)
                wait = backoff
                backoff = min(backoff * 2, MAX_BACKOFF)
            self._kick.clear()
            try:
                await asyncio.wait_for(_first(stop, self._kick), timeout=wait)
            except TimeoutError:
                pass

    async def goodbye(self) -> None:
        """The last heartbeat: the engine is stopped and nothing is loaded."""
        if not self.registered.is_set():
            return
        try:
            await asyncio.wait_for(self._post(nodeapi.PATH_HEARTBEAT, await self.heartbeat_body(goodbye=True)), timeout=3)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            log.info("could not say goodbye to the leader: %s", err or type(err).__name__)
        finally:
            if self._session is not None:
                await self._session.close()


async def _first(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(text: str) -> str:
    import json

    try:
        body = json.loads(text)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:300]
