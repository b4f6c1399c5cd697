"""``opod up --role door --routes FILE``: a door in front of several leaders, in the foreground.

The lead's ``opod up`` calls :func:`run`; this module adds no command of its own.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvloop

from opod import __version__, config
from opod.cli.common import fail, out


def run(routes_path: str | Path | None, listen: str = "") -> None:
    """Start a door and serve until Ctrl-C or SIGTERM.

    ``routes_path``: the routes file (else ``OPOD_DOOR_ROUTES``); ``listen``: host:port
    (else ``OPOD_LISTEN``, else ``0.0.0.0:8080``). Problems exit with a message via typer.
    """
    from opod.http.serving import ListenError, parse_listen

    path = routes_path or config.read("OPOD_DOOR_ROUTES")
    if not path:
        raise fail("a door needs a routes file: give --routes FILE (or set OPOD_DOOR_ROUTES)")
    try:
        address = parse_listen(listen or config.read("OPOD_LISTEN") or "0.0.0.0:8080", "0.0.0.0", "--listen")
    except ValueError as error:
        raise fail(str(error)) from None
    try:
        uvloop.run(_run(Path(path).expanduser(), address))
    except ListenError as error:
        raise fail(str(error)) from None


def _say(type_: str, subject: str, data: Mapping[str, Any] | None = None) -> None:
    # A door has no event stream: its routes events are lines on the console.
    data = data or {}
    if type_.endswith(".updated"):
        aliases = ", ".join(data.get("aliases", [])) or "none"
        out.print(f"routes revision {data.get('revision')!r} applied from {subject}: {aliases}")
    else:
        out.print(
            f"[yellow]routes file not applied:[/] {data.get('reason')} (keeping revision {data.get('kept_revision')!r})"
        )


async def _run(path: Path, address: tuple[str, int]) -> None:
    from opod.door.server import DoorError, DoorServer

    server = DoorServer(path, address, _say)
    try:
        await server.start()
    except DoorError as error:
        raise fail(str(error)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host, _ = address
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    table = server.routes.table()
    assert table is not None
    out.print(
        f"[bold]opod {__version__}[/] door: OpenAI API on http://{shown}:{server.port}/v1 for "
        f"{len(table.targets)} model(s), routes from {path} (revision {table.revision!r})"
    )
    await server.serve(stop)
    out.print("door stopped")
