"""A worker, assembled: identity, inventory, the engine manager, its listener and its agent.

``opod join`` runs one on its own; ``opod up`` runs one beside the leader in the
same event loop. Stopping it stops the engines first, then sends the final
"stopped" heartbeat, so the leader stops routing here at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opod import config
from opod.catalog import load_catalog
from opod.contract import env as contract_env
from opod.contract import nodeapi
from opod.contract.wire import WireError
from opod.engines import llama_binary, llama_devices
from opod.engines.errors import LaunchError
from opod.engines.registry import get_driver
from opod.http.serving import Listener, bind
from opod.worker import identity, inventory
from opod.worker.agent import Agent
from opod.worker.api import WorkerAPI
from opod.worker.engines import EngineManager
from opod.worker.supervisor import Supervisor

log = logging.getLogger("opod.worker")


@dataclass
class WorkerSettings:
    leader_url: str
    token: str
    home: Path
    listen: tuple[str, int] = ("0.0.0.0", 8081)
    engine: str = "llamacpp"
    threads: int = 0
    node_id: str | None = None
    flags: dict = field(default_factory=dict)
    leader_ca: str | None = None
    """``OPOD_LEADER_CA``: the one certificate trusted for an https leader (a path or the PEM)."""
    client_cert: str | None = None
    client_key: str | None = None
    leader_ssl: Any = None
    """A ready TLS context for the leader (``opod up``'s own worker pins the listener's certificate)."""

    @classmethod
    def tls_from_env(cls) -> dict:
        """The TLS settings of ``opod join`` from the environment."""
        cert, key = config.read("OPOD_NODE_CERT"), config.read("OPOD_NODE_KEY")
        if bool(cert) != bool(key):
            raise ValueError("OPOD_NODE_CERT and OPOD_NODE_KEY go together: set both, or neither")
        return {"leader_ca": config.read(contract_env.ENV_LEADER_CA), "client_cert": cert, "client_key": key}


def engine_flags() -> dict:
    """``OPOD_ENGINE_FLAGS``: a JSON object of engine flags, or a clear error."""
    text = config.read(contract_env.ENV_ENGINE_FLAGS)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{contract_env.ENV_ENGINE_FLAGS} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{contract_env.ENV_ENGINE_FLAGS} must be a JSON object such as {{\"ctx\": 4096}}")
    return value


def wanted_adapters() -> list[nodeapi.Adapter]:
    """``OPOD_ADAPTERS``: the LoRA adapters attached to every model this worker serves (``[]`` when unset)."""
    text = config.read(contract_env.ENV_ADAPTERS)
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{contract_env.ENV_ADAPTERS} is not JSON: {err}") from None
    example = '[{"name": "support", "source": "/data/adapters/support", "rank": 16}]'
    if not isinstance(value, list):
        raise ValueError(f"{contract_env.ENV_ADAPTERS} must be a JSON list such as {example}")
    adapters = []
    for i, item in enumerate(value):
        try:
            adapter = nodeapi.Adapter.from_wire(json.dumps(item))
        except WireError as err:
            raise ValueError(f"{contract_env.ENV_ADAPTERS}[{i}]: {err}") from None
        if not adapter.name or not adapter.source or ":" in adapter.name:
            raise ValueError(f"{contract_env.ENV_ADAPTERS}[{i}]: needs a name (without ':') and a source, as in {example}")
        adapters.append(adapter)
    return adapters


def plan_revision() -> int:
    """``OPOD_PLAN_REVISION``: the plan revision this worker was started for (0 = not stated)."""
    text = config.read(contract_env.ENV_PLAN_REVISION)
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"{contract_env.ENV_PLAN_REVISION}={text!r} must be a whole number (the plan revision)")
    return int(text)


class Worker:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        get_driver(settings.engine)  # an unknown engine is refused before anything starts
        self.node_id = settings.node_id or identity.node_id(settings.home)
        self.boot_id = identity.boot_id()
        self.supervisor = Supervisor(on_change=lambda _process: self._changed())
        self.manager = EngineManager(
            engine_id=settings.engine,
            home=settings.home,
            catalog=load_catalog(),
            supervisor=self.supervisor,
            threads=settings.threads,
            flags=settings.flags,
            sleep_mode=config.flag(contract_env.ENV_SLEEP_MODE),
            on_change=self._changed,
            adapters=wanted_adapters(),
        )
        self.agent: Agent | None = None
        self.listener: Listener | None = None

    def _changed(self) -> None:
        if self.agent is not None:
            self.agent.kick()

    def bind(self) -> Listener:
        host, port = self.settings.listen
        sock = bind(host, port, "the worker")
        api = WorkerAPI(self.node_id, self.settings.token, self.manager, self.supervisor, self.settings.home)
        self.listener = Listener(api.app(), sock, "worker")
        address = identity.advertise_address(host, self.listener.port, self.settings.leader_url)
        caps = inventory.take(self.settings.home).capabilities(engine=self.manager.driver.id, plan_revision=plan_revision())
        self.agent = Agent(
            leader_url=self.settings.leader_url,
            node_id=self.node_id,
            token=self.settings.token,
            boot_id=self.boot_id,
            address=address,
            capabilities=caps,
            manager=self.manager,
            leader_ca=self.settings.leader_ca,
            client_cert=self.settings.client_cert,
            client_key=self.settings.client_key,
            ssl_context=self.settings.leader_ssl,
        )
        return self.listener

    async def run(self, stop: asyncio.Event) -> None:
        assert self.agent is not None, "bind() first"
        # Beside registration, not before it: the binary may take seconds to list its devices.
        check = asyncio.create_task(self._check_gpu_use(self.agent.capabilities.gpus or []))
        try:
            await self.agent.run(stop)
        finally:
            check.cancel()

    async def _check_gpu_use(self, gpus: list[nodeapi.GPU]) -> None:
        """On a machine with GPUs, say when the llama-server this worker starts cannot use them."""
        if not gpus or self.manager.driver.id != "llamacpp":
            return
        try:
            route = llama_binary.resolve()
        except LaunchError:
            return  # the first launch names what is wrong with OPOD_LLAMA_SERVER
        devices = await asyncio.to_thread(llama_devices.list_devices, route.argv)
        warning = llama_devices.unused_gpus_warning(gpus, devices, route.why)
        if warning:
            log.warning("%s", warning)
        elif devices:
            log.info("llama.cpp can use: %s", "; ".join(devices))

    async def shutdown(self) -> None:
        await self.manager.stop_all()
        if self.agent is not None:
            await self.agent.goodbye()
