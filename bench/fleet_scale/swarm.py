"""Many simulated workers in one asyncio process: register, heartbeat at the real interval, answer loads.

``python -m bench.fleet_scale.swarm --leader URL --token T --nodes N --port P`` registers N nodes
(``shape.capabilities``: the declared inventory a real ``opod join --inventory`` would send) on the
leader's public listener, each call signed with the node token as ``opod.worker.agent`` signs it,
then sends each node's heartbeat every ``HEARTBEAT_EVERY`` seconds, the nodes spread evenly over
the interval. 1,000 ``opod join`` processes would not fit on two cores; the leader cannot tell
the difference, since what it sees is the same calls.

Every node gives the same address: this process's one listener, which plays each node's worker
API for the reconciler (``/v1/model/load`` answers ``ready`` and the model shows in that node's
next heartbeat, ``/v1/model/unload`` forgets it). The node a call is for is read from its
signature's ``id=``. ``GET /swarm/status`` says how far registration got and when each load
arrived, so the benchmark times a reconciler pass from the calls it makes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from bench.fleet_scale import shape
from opod.contract import nodeapi
from opod.contract.nodeauth import HEADER
from opod.security.signer import Signer
from opod.worker.agent import HEARTBEAT_EVERY

REGISTER_AT_ONCE = 16
"""Registrations in flight together: a fleet coming up, without queueing a thousand calls at the leader."""


@dataclass
class SimNode:
    index: int
    id: str
    signer: Signer
    boot_id: str
    register_body: str
    loaded: set[str] = field(default_factory=set)
    body: bytes = b""
    """The heartbeat body, rebuilt only when what it says changes (the signature is per call)."""

    def heartbeat_body(self, since: str) -> bytes:
        if not self.body:
            hb = nodeapi.Heartbeat(
                id=self.id,
                loaded_models=sorted(self.loaded),
                boot_id=self.boot_id,
                engine=nodeapi.EngineState(state=nodeapi.EngineStateWord.SERVING, since=since),
                slots=64,
                disk_free_gb=20000,
            )
            self.body = hb.to_json().encode()
        return self.body


@dataclass
class Counters:
    registered: int = 0
    register_errors: int = 0
    beats: int = 0
    beat_errors: int = 0
    reregistered: int = 0
    last_error: str = ""
    beat_seconds: list[float] = field(default_factory=list)
    """Heartbeat round trips since the last status read (the leader's answer time as a worker sees it)."""
    loads: list[tuple[float, str, str]] = field(default_factory=list)
    """(wall time, node, model) of every load call received."""
    unloads: int = 0


class Swarm:
    def __init__(self, leader: str, token: str, count: int, address: str) -> None:
        self.leader = leader.rstrip("/")
        self.count = count
        self.address = address
        self.counters = Counters()
        self.since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.nodes: dict[str, SimNode] = {}
        for i in range(count):
            nid = shape.node_id(i)
            caps = shape.capabilities(i)
            req = nodeapi.RegisterRequest(
                id=nid,
                hostname=caps.hostname,
                os=caps.os,
                arch=caps.arch,
                ram_gb=caps.ram_gb,
                address=address,
                hardware_json=nodeapi.encode_hardware(caps),
                boot_id=secrets.token_hex(8),
            )
            self.nodes[nid] = SimNode(i, nid, Signer(nid, token), req.boot_id, req.to_json())
        self.session: aiohttp.ClientSession | None = None

    async def _post(self, node: SimNode, path: str, body: bytes | str) -> int:
        assert self.session is not None
        headers = {"Content-Type": "application/json", **node.signer.headers("POST", path)}
        async with self.session.post(self.leader + path, data=body, headers=headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                self.counters.last_error = f"{path} for {node.id}: HTTP {resp.status} {text[:200]}"
            return resp.status

    async def register(self, node: SimNode) -> bool:
        try:
            status = await self._post(node, nodeapi.PATH_REGISTER, node.register_body)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            self.counters.register_errors += 1
            self.counters.last_error = f"register {node.id}: {err or type(err).__name__}"
            return False
        if status != 200:
            self.counters.register_errors += 1
            return False
        return True

    async def register_all(self) -> None:
        gate = asyncio.Semaphore(REGISTER_AT_ONCE)

        async def one(node: SimNode) -> None:
            async with gate:
                for _ in range(60):  # a refused or failed registration is tried again each second, for a minute
                    if await self.register(node):
                        self.counters.registered += 1
                        return
                    await asyncio.sleep(1.0)

        await asyncio.gather(*(one(n) for n in self.nodes.values()))

    async def beat_forever(self, node: SimNode, offset: float) -> None:
        """Heartbeats at the agent's interval, on a fixed schedule (a slow answer does not shift the next one)."""
        due = time.monotonic() + offset
        while True:
            await asyncio.sleep(max(due - time.monotonic(), 0))
            due += HEARTBEAT_EVERY
            started = time.monotonic()
            try:
                status = await self._post(node, nodeapi.PATH_HEARTBEAT, node.heartbeat_body(self.since))
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                self.counters.beat_errors += 1
                self.counters.last_error = f"heartbeat {node.id}: {err or type(err).__name__}"
                continue
            if status == 404:
                self.counters.reregistered += 1
                await self.register(node)
                continue
            if status != 200:
                self.counters.beat_errors += 1
                continue
            self.counters.beats += 1
            self.counters.beat_seconds.append(time.monotonic() - started)

    # --- the workers' API, for every node at once --------------------------------------------

    def _node_of(self, request: web.Request) -> SimNode | None:
        value = request.headers.get(HEADER, "")
        for part in value.split(","):
            key, _, val = part.strip().partition("=")
            if key == "id":
                return self.nodes.get(val)
        return None

    async def load(self, request: web.Request) -> web.Response:
        node = self._node_of(request)
        body = await request.json()
        if node is None:
            return web.json_response({"error": "unknown node"}, status=404)
        model = str(body.get("id", ""))
        self.counters.loads.append((time.time(), node.id, model))
        node.loaded.add(model)
        node.body = b""
        return web.json_response({"status": nodeapi.Status.READY, "model": model})

    async def unload(self, request: web.Request) -> web.Response:
        node = self._node_of(request)
        body = await request.json()
        if node is not None:
            node.loaded.discard(str(body.get("id", "")))
            node.body = b""
        self.counters.unloads += 1
        return web.json_response({"status": nodeapi.Status.UNLOADED})

    async def status(self, request: web.Request) -> web.Response:
        c = self.counters
        seconds, c.beat_seconds = sorted(c.beat_seconds), []
        loads = [t for t, _, _ in c.loads]
        return web.json_response(
            {
                "nodes": self.count,
                "registered": c.registered,
                "register_errors": c.register_errors,
                "beats": c.beats,
                "beat_errors": c.beat_errors,
                "reregistered": c.reregistered,
                "last_error": c.last_error,
                "beat_p50": seconds[len(seconds) // 2] if seconds else None,
                "beat_p99": seconds[min(int(len(seconds) * 0.99), len(seconds) - 1)] if seconds else None,
                "loads": len(loads),
                "first_load": min(loads, default=None),
                "last_load": max(loads, default=None),
                "loaded_nodes": sum(1 for n in self.nodes.values() if n.loaded),
                "unloads": c.unloads,
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(nodeapi.PATH_MODEL_LOAD, self.load)
        app.router.add_post(nodeapi.PATH_MODEL_UNLOAD, self.unload)
        app.router.add_get("/swarm/status", self.status)
        return app

    async def run(self, port: int, stop: asyncio.Event) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        # Every node's address is this one listener, and a pass opens a connection per replica at once (the leader's
        # pool has no limit): a short accept queue would drop SYNs and add the kernel's 1 s retransmission to the pass.
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        # One pool for all nodes: connections are reused between nodes' calls (real workers hold one each).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256), timeout=aiohttp.ClientTimeout(total=30)
        )
        print(json.dumps({"listening": port}), flush=True)
        try:
            await self.register_all()
            print(json.dumps({"registered": self.counters.registered}), flush=True)
            # Evenly spread over one interval, as workers that joined at different times are.
            order = list(self.nodes.values())
            random.Random(0).shuffle(order)
            tasks = [
                asyncio.create_task(self.beat_forever(n, HEARTBEAT_EVERY * k / len(order))) for k, n in enumerate(order)
            ]
            await stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await self.session.close()
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leader", required=True, help="the leader's public URL (where workers register)")
    parser.add_argument("--token", required=True, help="a node token (POST /api/v1/node-tokens)")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True, help="this process's listener: every node's worker API")
    args = parser.parse_args()
    swarm = Swarm(args.leader, args.token, args.nodes, f"127.0.0.1:{args.port}")

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await swarm.run(args.port, stop)

    asyncio.run(go())


if __name__ == "__main__":
    main()
