"""The leader's calls to one worker for a gang: start and stop an RPC part, load and unload the coordinator.

All go through :class:`opod.http.nodeclient.WorkerClient` (signed as the
worker's node). A part is started by trying: each port the plan allows, and
for each the RPC server commands in order, until one listens and stays up.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import ip_address
from urllib.parse import urlencode

from opod.contract import nodeapi
from opod.contract.catalog import Source
from opod.contract.wire import SECOND
from opod.engines import rpc_binary
from opod.fleet.state import NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.shards.errors import worker_failed

log = logging.getLogger("opod.shards")

PORT_TAKEN = "Failed to create server socket"
"""What llama.cpp's RPC server prints (and then exits 0) when its port is in use."""
PART_UNREACHABLE = "Failed to connect to"
"""What llama-server prints for an ``--rpc`` endpoint it cannot reach; it then carries on without that part."""


def coordinator_process_id(model: str) -> str:
    """The worker's process id for the engine serving ``model`` (named by opod.worker.engines)."""
    return f"engine-{model}"


@dataclass(frozen=True, slots=True)
class Timing:
    """Bounds of the waits; tests shorten them."""

    part_ready: float = 30.0
    """An RPC server listens at once; this bounds a slow spawn."""
    settle: float = 0.5
    """A part that exits right after its port answered lost a race for the port."""
    coordinator_ready: float = 900.0
    """Weights may be sent over RPC to every part before the coordinator answers."""
    heartbeat: float = 20.0
    """How long the coordinator's model may take to show up in its worker's heartbeat."""
    call: float = 30.0
    poll: float = 0.2


def host_of(node: NodeState) -> str:
    host = node.address.rpartition(":")[0] if ":" in node.address else node.address
    return host.strip("[]") or "127.0.0.1"


def bind_host(node: NodeState) -> str:
    """Where a part listens: loopback for a worker reached over loopback, every interface otherwise.

    The RPC protocol has no authentication, so a part is exposed no wider than
    the coordinator needs.
    """
    host = host_of(node)
    try:
        loopback = ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return "127.0.0.1" if loopback else "0.0.0.0"


async def get_process(
    workers: WorkerClient, node: NodeState, process_id: str, timeout: float = 10.0
) -> nodeapi.ProcessInfo | None:
    """The worker's view of one process; ``None`` when it has no such process. Raises WorkerUnavailable."""
    status, body = await workers.call_json(
        node, "GET", f"{nodeapi.PATH_PROCESS_GET}?{urlencode({'id': process_id})}", timeout=timeout
    )
    if status == 404:
        return None
    if status != 200 or not isinstance(body, dict):
        raise WorkerUnavailable(f"worker {node.id} answered HTTP {status} to process get: {str(body).strip()[:200]}")
    return nodeapi.ProcessInfo.from_wire(body)


async def process_logs(workers: WorkerClient, node: NodeState, process_id: str, lines: int = 40) -> str:
    try:
        status, body = await workers.call_json(
            node, "GET", f"{nodeapi.PATH_PROCESS_LOGS}?{urlencode({'id': process_id, 'lines': lines})}", timeout=10
        )
    except WorkerUnavailable:
        return ""
    return body if status == 200 and isinstance(body, str) else ""


async def stop_process(workers: WorkerClient, node: NodeState, process_id: str, timeout: float = 30.0) -> None:
    """Stop one process; an unknown id is already stopped. Raises WorkerUnavailable."""
    status, body = await workers.call_json(node, "POST", nodeapi.PATH_PROCESS_STOP, {"id": process_id}, timeout=timeout)
    if status not in (204, 404):
        raise WorkerUnavailable(
            f"worker {node.id} answered HTTP {status} to stopping {process_id}: {str(body).strip()[:200]}"
        )


_LLAMA_LOG = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([A-Z]) (.*)$")
"""llama.cpp's log prefix: elapsed time and a level letter (``0.00.006.272 E gguf_init…``)."""


def _last_line(text: str) -> str:
    """The line that says why: llama.cpp's first error (the cause comes before the "exiting"), else the last
    line naming a failure, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("!!!")]
    for line in lines:
        match = _LLAMA_LOG.match(line)
        # The memory fitter reports any load failure first, in general words; the loader's own line follows.
        if match and match.group(1) == "E" and "fit_params" not in line:
            return match.group(2).strip()[:200]
    failing = [line for line in lines if "error" in line.lower() or "fail" in line.lower()]
    return (failing or lines or [""])[-1][:200]


@dataclass(frozen=True, slots=True)
class StartedPart:
    port: int
    command: str


async def start_part(
    workers: WorkerClient, node: NodeState, process_id: str, ports: list[int], commands: list[str], timing: Timing
) -> StartedPart:
    """Start an RPC server on ``node``, trying each port and command; what ran, or a ShardError naming every try."""
    tries: list[str] = []
    for port in ports:
        for command in commands:
            outcome = await _try_part(workers, node, process_id, port, command, timing)
            if outcome == "":
                return StartedPart(port, command)
            tries.append(f"{command} on port {port}: {outcome}")
            if outcome.startswith("port"):
                break  # another command cannot free the port
            if not outcome.startswith("could not start"):
                raise worker_failed(f"the RPC part on {node.id} failed: {outcome}")
        else:
            raise worker_failed(f"no RPC server could be started on {node.id}: " + "; ".join(tries))
    raise worker_failed(
        f"every port tried on {node.id} is in use ({', '.join(str(p) for p in ports)}): "
        + "; ".join(tries)
        + "; free them or set the catalog's sharding.rpc_port_base elsewhere"
    )


async def _try_part(
    workers: WorkerClient, node: NodeState, process_id: str, port: int, command: str, timing: Timing
) -> str:
    """``""`` when the part runs; else ``port …`` (taken), ``could not start …`` (no such command) or another reason."""
    args = ["-H", bind_host(node), "-p", str(port)]
    if node.hardware.cpu_cores > 0:
        args += ["-t", str(node.hardware.cpu_cores)]
    spec = nodeapi.ProcessSpec(
        id=process_id,
        command=command,
        args=args,
        env=None,
        work_dir="",
        health_port=port,
        health_host="127.0.0.1",
        log_lines=200,
        health_path="",
        ready_timeout=int(timing.part_ready * SECOND),
        restart=True,
        max_restarts=3,
        restart_backoff=SECOND,
    )
    status, body = await workers.call_json(
        node, "POST", nodeapi.PATH_PROCESS_START, spec.to_wire(), timeout=timing.call
    )
    if status == 502 and isinstance(body, dict):
        error = str(body.get("error", ""))
        if "already running" not in error:
            return f"refused: {error}"
        # A live process with this id is left from an earlier try: replace it.
        await stop_process(workers, node, process_id)
        status, body = await workers.call_json(
            node, "POST", nodeapi.PATH_PROCESS_START, spec.to_wire(), timeout=timing.call
        )
    if status != 202:
        # A program that cannot be spawned is recorded as failed before the worker answers 500.
        info = await get_process(workers, node, process_id)
        if info is not None and info.exit_err.startswith("could not start"):
            return info.exit_err
        return f"HTTP {status}: {str(body).strip()[:200]}"
    deadline = time.monotonic() + timing.part_ready + 5
    info = None
    while time.monotonic() < deadline:
        info = await get_process(workers, node, process_id)
        if info is None or info.status != nodeapi.ProcessStatus.STARTING:
            break
        await asyncio.sleep(timing.poll)
    if info is not None and info.status == nodeapi.ProcessStatus.RUNNING:
        await asyncio.sleep(timing.settle)
        info = await get_process(workers, node, process_id)
        if info is not None and info.status == nodeapi.ProcessStatus.RUNNING:
            return ""
    logs = await process_logs(workers, node, process_id)
    await stop_process(workers, node, process_id)
    if PORT_TAKEN in logs:
        return f"port {port} is in use on {node.id}"
    if info is None:
        return "the worker lost the process"
    if info.status == nodeapi.ProcessStatus.STARTING:
        return f"did not listen on port {port} within {timing.part_ready:g}s"
    why = rpc_binary.describe_exit(info.exit_err or f"ended ({info.status})")
    line = _last_line(logs)
    return f"{why}" + (f" (it said: {line})" if line and line not in why else "")


# --- the coordinator: a normal model load with the RPC list ----------------------------


def load_request(model: str, source: Source | None, weights: str, rpc: str) -> nodeapi.LoadModelRequest:
    return nodeapi.LoadModelRequest(
        id=model,
        ollama_name=source.ollama_name if source else "",
        repo="" if weights else (source.repo if source else ""),
        file="" if weights else (source.file if source else ""),
        path=weights or (source.path if source else ""),
        flags={"rpc": rpc},
    )


async def unload_coordinator(
    workers: WorkerClient, node: NodeState, model: str, source: Source | None, timeout: float = 60.0
) -> None:
    """Raises WorkerUnavailable when the worker cannot be told."""
    req = nodeapi.UnloadModelRequest(
        id=model,
        ollama_name=source.ollama_name if source else "",
        repo=source.repo if source else "",
        path=source.path if source else "",
    )
    status, body = await workers.call_json(node, "POST", nodeapi.PATH_MODEL_UNLOAD, req.to_wire(), timeout=timeout)
    if status not in (200, 501):
        raise WorkerUnavailable(
            f"worker {node.id} answered HTTP {status} to unloading {model}: {str(body).strip()[:200]}"
        )


async def load_coordinator(
    workers: WorkerClient,
    node_of: Callable[[str], NodeState | None],
    node_id: str,
    req: nodeapi.LoadModelRequest,
    timing: Timing,
) -> None:
    """Load the coordinator and wait until it serves with every part; ShardError otherwise.

    ``node_of(id)`` reads the fleet afresh, since the wait spans heartbeats.
    Served = its engine process runs, its log shows no unreachable part, and
    the worker's heartbeat lists the model (so the router sends it requests).
    """
    model, pid = req.id, coordinator_process_id(req.id)
    node = node_of(node_id)
    if node is None:
        raise worker_failed(f"worker {node_id} is not in the fleet: the coordinator of {model} cannot load there")
    before = await get_process(workers, node, pid)
    old = (before.pid, before.started_at) if before is not None else None
    status, body = await workers.call_json(node, "POST", nodeapi.PATH_MODEL_LOAD, req.to_wire(), timeout=timing.call)
    if status != 200:
        raise worker_failed(
            f"worker {node_id} refused to load the coordinator of {model}: HTTP {status}: {str(body).strip()[:300]}"
        )
    deadline = time.monotonic() + timing.coordinator_ready
    while True:
        node = node_of(node_id)
        if node is not None and model in node.load_errors:
            raise worker_failed(f"the coordinator of {model} on {node_id} failed to load: {node.load_errors[model]}")
        info = await get_process(workers, node, pid) if node is not None else None
        if node is not None and info is not None and (info.pid, info.started_at) != old:
            if info.status == nodeapi.ProcessStatus.RUNNING:
                break
            if info.status in (
                nodeapi.ProcessStatus.FAILED,
                nodeapi.ProcessStatus.CRASHLOOP,
                nodeapi.ProcessStatus.STOPPED,
            ):
                line = _last_line(await process_logs(workers, node, pid))
                raise worker_failed(
                    f"the coordinator of {model} on {node_id} ended: {info.exit_err or info.status}"
                    + (f" (it said: {line})" if line else "")
                )
        if time.monotonic() > deadline:
            raise worker_failed(
                f"the coordinator of {model} on {node_id} did not serve within {timing.coordinator_ready:g}s"
            )
        await asyncio.sleep(timing.poll)
    logs = await process_logs(workers, node, pid, lines=400)
    missing = [line[line.index(PART_UNREACHABLE) :].strip() for line in logs.splitlines() if PART_UNREACHABLE in line]
    if missing:
        raise worker_failed(
            f"the coordinator of {model} on {node_id} could not reach its parts: {'; '.join(missing)[:300]}"
        )
    deadline = time.monotonic() + timing.heartbeat
    while time.monotonic() < deadline:
        node = node_of(node_id)
        if node is not None and model in node.loaded_models:
            return
        await asyncio.sleep(timing.poll)
    raise worker_failed(
        f"the coordinator of {model} runs on {node_id}, but the worker's heartbeat has not listed it within {timing.heartbeat:g}s"
    )
