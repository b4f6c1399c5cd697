"""``opod join URL --token T``: run a worker that joins a leader."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

import typer
import uvloop

from opod import config
from opod.cli import homelock
from opod.cli.common import collector_paused, fail, out, setup_logging, stop_grace_option

if TYPE_CHECKING:
    from opod.worker.run import Worker


def command(
    leader_url: str = typer.Argument(..., metavar="URL", help="The leader's public URL, e.g. http://10.0.0.2:8080."),
    token: str = typer.Option(..., "--token", help="A node token from `opod token create --node` on the leader."),
    listen: str = typer.Option(
        "", help="This worker's listener host:port [default: 0.0.0.0:8081, or OPOD_WORKER_LISTEN]."
    ),
    engine: str = typer.Option("llamacpp", help="Engine to run models with: llamacpp, vllm, sglang, ollama or sim."),
    threads: int = typer.Option(0, help="CPU threads per engine (0 = the engine's default)."),
    stop_grace: float | None = stop_grace_option(),
    inventory: str = typer.Option(
        "",
        "--inventory",
        metavar="FILE",
        help="A declared inventory (YAML or JSON: GPUs, MIG instances, labels) reported instead of the driver's [or OPOD_INVENTORY].",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Join a leader as a worker and run its models on this machine's engines."""
    with collector_paused():
        from opod.http.serving import ListenError, parse_listen
        from opod.http.tls.client import TLSClientError
        from opod.worker.run import WorkerSettings, engine_flags, open_worker

    setup_logging(verbose)
    for line in config.retired_warnings() + config.unsupported_warnings():
        out.print(f"[yellow]warning:[/] {line}")
    if not leader_url.startswith(("http://", "https://")):
        raise fail(f"URL {leader_url!r} must start with http:// or https://")
    try:
        homelock.hold(config.home(), "opod join")
    except homelock.HomeInUse as error:
        raise fail(str(error)) from None
    try:
        settings = WorkerSettings(
            leader_url=leader_url,
            token=token.strip(),
            home=config.home(),
            engine=engine,
            threads=threads,
            flags=engine_flags(),
            listen=parse_listen(listen or config.read("OPOD_WORKER_LISTEN") or "0.0.0.0:8081", "0.0.0.0", "--listen"),
            stop_grace=config.stop_grace() if stop_grace is None else stop_grace,
            inventory=inventory or None,
            reexec=True,
            **WorkerSettings.tls_from_env(),
        )
        worker = open_worker(settings)
    except (ValueError, KeyError, TLSClientError, ListenError) as error:
        raise fail(str(error)) from None
    uvloop.run(_run(worker))


async def _run(worker: Worker) -> None:
    from opod.http.serving import settle_memory
    from opod.worker.agent import TokenRefused
    from opod.worker.run import STOP_SIGNALS

    out.print(
        f"worker {worker.node_id} on {worker.listener.address}, joining {worker.settings.leader_url} with engine {worker.settings.engine}"
    )
    stop = asyncio.Event()

    worker.say = out.print

    def on_signal() -> None:
        if not stop.is_set():
            grace = worker.settings.stop_grace
            out.print(
                f"stopping: no new requests are sent here; those in flight get up to {grace:g} s, then the engines stop"
                if grace > 0
                else "stopping: the engines, then the listener"
            )
            stop.set()
        else:
            out.print("stopping now: the engines are killed")
            worker.hurry()

    loop = asyncio.get_running_loop()
    await _stop_signals_to_this_thread(loop, STOP_SIGNALS)
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    # A process that restarted itself begins with them blocked (``Worker.restart_process``): one that came
    # while it started is handled now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    settle_memory()
    try:
        await worker.run(stop)
    except TokenRefused as error:
        raise fail(
            f"{error}. Create a node token on the leader with `opod token create --node` and join again."
        ) from None
    out.print("stopped")


async def _stop_signals_to_this_thread(loop: asyncio.AbstractEventLoop, signals: frozenset[signal.Signals]) -> None:
    """Let only the loop's thread take Ctrl-C and SIGTERM: every other thread blocks them from its start.

    When the worker restarts as a new process it blocks them on the loop's thread too, so one that comes then
    stays pending across the exec for the new process to handle; a thread that took it would lose it. The
    threads are made here with the signals blocked, as a thread starts with its maker's mask: the default
    executor's (which blocks them in each of its threads), and libuv's pool, started by a first name look-up.
    """
    from concurrent.futures import ThreadPoolExecutor

    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    loop.set_default_executor(
        ThreadPoolExecutor(initializer=signal.pthread_sigmask, initargs=(signal.SIG_BLOCK, signals))
    )
    with contextlib.suppress(OSError):
        await loop.getaddrinfo("localhost", None)
