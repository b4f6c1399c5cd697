"""``opod join URL --token T``: run a worker that joins a leader."""

from __future__ import annotations

import asyncio
import signal

import typer
import uvloop

from opod import config
from opod.cli.common import fail, out, setup_logging


def command(
    leader_url: str = typer.Argument(..., metavar="URL", help="The leader's public URL, e.g. http://10.0.0.2:8080."),
    token: str = typer.Option(..., "--token", help="A node token from `opod token create --node` on the leader."),
    listen: str = typer.Option("", help="This worker's listener host:port [default: 0.0.0.0:8081, or OPOD_WORKER_LISTEN]."),
    engine: str = typer.Option("llamacpp", help="Engine to run models with: llamacpp, vllm, sglang, ollama or sim."),
    threads: int = typer.Option(0, help="CPU threads per engine (0 = the engine's default)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Join a leader as a worker and run its models on this machine's engines."""
    from opod.http.serving import parse_listen
    from opod.http.tls.client import TLSClientError
    from opod.worker.run import Worker, WorkerSettings, engine_flags

    setup_logging(verbose)
    for line in config.retired_warnings() + config.unsupported_warnings():
        out.print(f"[yellow]warning:[/] {line}")
    if not leader_url.startswith(("http://", "https://")):
        raise fail(f"URL {leader_url!r} must start with http:// or https://")
    try:
        settings = WorkerSettings(
            leader_url=leader_url, token=token.strip(), home=config.home(), engine=engine, threads=threads, flags=engine_flags(),
            listen=parse_listen(listen or config.read("OPOD_WORKER_LISTEN") or "0.0.0.0:8081", "0.0.0.0", "--listen"),
            **WorkerSettings.tls_from_env(),
        )
        worker = Worker(settings)
    except (ValueError, KeyError, TLSClientError) as error:
        raise fail(str(error)) from None
    uvloop.run(_run(worker))


async def _run(worker) -> None:
    from opod.http.serving import ListenError, serve, settle_memory
    from opod.worker.agent import TokenRefused

    try:
        listener = worker.bind()
    except ListenError as error:
        raise fail(str(error)) from None
    out.print(f"worker {worker.node_id} on {listener.address}, joining {worker.settings.leader_url} with engine {worker.settings.engine}")
    stop = asyncio.Event()
    servers_stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    settle_memory()
    serving = asyncio.create_task(serve([listener], servers_stop))
    refused: TokenRefused | None = None
    try:
        await worker.run(stop)
    except TokenRefused as error:
        refused = error
    out.print("stopping: engines first")
    await worker.shutdown()
    servers_stop.set()
    await serving
    if refused is not None:
        raise fail(f"{refused}. Create a node token on the leader with `opod token create --node` and join again.")
    out.print("stopped")
