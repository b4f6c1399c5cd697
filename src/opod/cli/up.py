"""``opod up``: a leader and, unless ``--no-worker``, a local worker, in one command."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import uvloop

from opod import __version__, config
from opod.cli import heap, homelock
from opod.cli.common import collector_paused, fail, out, setup_logging, stop_grace_option

if TYPE_CHECKING:
    from opod.leader.run import UpSettings


def command(
    no_worker: bool = typer.Option(False, "--no-worker", help="Run the leader only; workers join with opod join."),
    listen: str = typer.Option(
        "", metavar="HOST:PORT", help="Public listener host:port [default: 0.0.0.0:8080, or OPOD_LISTEN]."
    ),
    admin_listen: str = typer.Option(
        "", metavar="HOST:PORT", help="Admin listener host:port [default: 127.0.0.1:9090, or OPOD_ADMIN_LISTEN]."
    ),
    worker_listen: str = typer.Option(
        "", metavar="HOST:PORT", help="Local worker listener host:port [default: 127.0.0.1:8081]."
    ),
    engine: str = typer.Option(
        "llamacpp", metavar="ENGINE", help="The local worker's engine: llamacpp, vllm, sglang, ollama or sim."
    ),
    threads: int = typer.Option(0, metavar="N", help="CPU threads per engine (0 = the engine's default)."),
    open_access: bool = typer.Option(False, "--open", help="Serve /v1 without API keys (trusted networks only)."),
    no_default_models: bool = typer.Option(
        False, "--no-default-models", help="Do not add the CPU default models on first start."
    ),
    stop_grace: float | None = stop_grace_option(),
    inventory: str = typer.Option(
        "",
        "--inventory",
        metavar="FILE",
        help="The local worker's declared inventory (YAML or JSON: GPUs, MIG instances, labels) [or OPOD_INVENTORY].",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug detail."),
    role: str = typer.Option(
        "leader",
        "--role",
        metavar="ROLE",
        help="leader (default), or door: a model-name router in front of several leaders.",
    ),
    routes: str = typer.Option(
        "",
        "--routes",
        metavar="PATH",
        help="With --role door: the routes file (model name → leader) [or OPOD_DOOR_ROUTES].",
    ),
) -> None:
    """Start a leader (and a local worker): one OpenAI-compatible endpoint on :8080."""
    if role == "door":
        from opod.cli.door import run as run_door

        setup_logging(verbose)
        run_door(routes or None, listen)
        return
    if role != "leader":
        raise fail(f"--role {role!r}: choose leader or door")
    if routes:
        raise fail("--routes is for --role door")
    with collector_paused():
        from opod.http.serving import parse_listen
        from opod.leader.leader import LeaderSettings
        from opod.leader.run import UpSettings
        from opod.worker.run import WorkerSettings, engine_flags

    setup_logging(verbose)
    home = config.home()
    tls_cert, tls_key = config.read("OPOD_TLS_CERT"), config.read("OPOD_TLS_KEY")
    if bool(tls_cert) != bool(tls_key):
        raise fail("OPOD_TLS_CERT and OPOD_TLS_KEY go together: set both to serve HTTPS, or neither")
    try:
        settings = UpSettings(
            leader=LeaderSettings(
                home=home,
                database_url=config.read("OPOD_DATABASE_URL"),
                require_keys=not open_access,
                default_models=not no_default_models,
                tls_cert=Path(tls_cert) if tls_cert else None,
                tls_key=Path(tls_key) if tls_key else None,
            ),
            listen=parse_listen(listen or config.read("OPOD_LISTEN") or "0.0.0.0:8080", "0.0.0.0", "--listen"),
            admin_listen=parse_listen(
                admin_listen or config.read("OPOD_ADMIN_LISTEN") or "127.0.0.1:9090", "127.0.0.1", "--admin-listen"
            ),
            probe_listen=parse_listen(probe, "0.0.0.0", "OPOD_PROBE_LISTEN")
            if (probe := config.read("OPOD_PROBE_LISTEN"))
            else None,
            stop_grace=config.stop_grace() if stop_grace is None else stop_grace,
            worker=None
            if no_worker
            else WorkerSettings(
                leader_url="",
                token="",
                home=home,
                engine=engine,
                threads=threads,
                flags=engine_flags(),
                listen=parse_listen(
                    worker_listen or config.read("OPOD_WORKER_LISTEN") or "127.0.0.1:8081",
                    "127.0.0.1",
                    "--worker-listen",
                ),
                inventory=inventory or None,
            ),
        )
        if settings.worker is not None and (
            declared_file := settings.worker.inventory or config.read("OPOD_INVENTORY")
        ):
            from opod.worker.declared import load as load_inventory

            load_inventory(declared_file)  # a bad file stops opod up here, naming the field
    except ValueError as error:
        raise fail(str(error)) from None
    for line in config.retired_warnings() + config.unsupported_warnings():
        out.print(f"[yellow]warning:[/] {line}")
    try:
        homelock.hold(home, "opod up")
    except homelock.HomeInUse as error:
        raise fail(str(error)) from None
    uvloop.run(_run(settings))


async def _run(settings: UpSettings) -> None:
    from opod.http.serving import ListenError
    from opod.http.tls.server import TLSConfigError
    from opod.leader.run import Up
    from opod.store import StoreError

    up = Up(settings, say=lambda line: out.print(line))
    try:
        await up.start()
    except (ListenError, RuntimeError, ValueError, TLSConfigError, StoreError) as error:
        raise fail(str(error)) from None
    logging.getLogger("opod.heap").info(heap.current.said)  # once started: a refused start says one line
    public, admin = up.listeners[0], up.listeners[1]
    host, port = settings.listen
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    out.print(
        f"[bold]opod {__version__}[/]: OpenAI API on {public.scheme}://{shown}:{public.port}/v1, admin API on http://{admin.address}/api/v1"
    )
    out.print(f"data in {settings.leader.home}")
    probes = [listener for listener in up.listeners if listener.name == "probe"]
    if probes:
        out.print(f"probes (/healthz /readyz /loadz /metrics) also on http://{probes[0].address}")
    if up.leader.new_admin_key:
        out.print(f"[bold]admin key[/] (shown once; also in {settings.leader.home / 'admin.key'}, mode 0600):")
        out.print(f"  {up.leader.new_admin_key}")
    if up.worker is not None:
        out.print(
            f"local worker {up.worker.node_id} on {up.worker.listener.address} with engine {up.worker.settings.engine}"
        )
    chat_model = up.leader.models.default_for("chat")
    if chat_model:
        example = (
            f'curl {public.scheme}://{shown}:{public.port}/v1/chat/completions -H "Authorization: Bearer $(cat {settings.leader.home / "admin.key"})" '
            f'-H \'Content-Type: application/json\' -d \'{{"model": "{chat_model}", "messages": [{{"role": "user", "content": "Hello"}}]}}\''
        )
        out.print(f"[dim]try, once it is served: {example}[/]")
    else:
        out.print("[dim]no model yet: opod model add smollm2-135m-instruct (opod catalog ls lists more)[/]")
    await up.run()
