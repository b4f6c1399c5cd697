"""What every opod command shares: consoles, logging, and talking to the leader's admin API."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table

from opod import config


def console(stderr: bool = False) -> Console:
    """A console that wraps lines only for a person at a terminal.

    Piped into a file or another program (a log, ``| cat``), a line stays one line, so a
    command printed in it (the banner's curl) still works when copied.
    """
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream is not None and stream.isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=not terminal)


out = console()
err = console(stderr=True)

_UNBOUNDED = 1_000_000
"""A width no table reaches: what a table measures at when nothing constrains it."""


def print_whole(thing: RenderableType, shown: Console | None = None) -> None:
    """Print a table (or a tree) with every column that does not wrap (ids, names, paths) whole, at any width.

    Piped (a file, ``| grep``), each row is one line as wide as it needs: nothing is cut at the 80 columns a
    pipe is given, and the lines carry no trailing padding. At a terminal, the columns that wrap fold to fit
    its width; where even that leaves no room for the others whole, the lines run past the edge rather than
    cutting a value (a copied id must work).
    """
    shown = shown or out
    unbounded = shown.options.update_width(_UNBOUNDED)
    if isinstance(thing, Table):
        for column in thing.columns:
            if column.no_wrap:
                widths = [Measurement.get(shown, unbounded, cell).maximum for cell in (column.header, *column.cells)]
                column.min_width = max(column.min_width or 0, *widths)
    minimum, maximum = Measurement.get(shown, unbounded, thing)
    width = max(shown.width, minimum) if shown.is_terminal else max(shown.width, maximum)
    if width == shown.width and shown.is_terminal:
        shown.print(thing)
        return
    buffer = io.StringIO()
    canvas = Console(
        file=buffer,
        width=width,
        color_system="auto" if shown.color_system else None,
        force_terminal=shown.is_terminal,
        no_color=shown.no_color,
        highlight=False,
    )
    canvas.print(thing)
    text = buffer.getvalue()
    if not shown.is_terminal:
        text = "".join(line.rstrip() + "\n" for line in text.splitlines())
    shown.file.write(text)
    shown.file.flush()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a command imports what it runs (the leader, a worker).

    Those imports make many objects that live as long as the process, and the collector walks every one of
    them again at each of its full passes meanwhile, freeing next to nothing: reference counting frees what
    dies. Once serving, their start-up objects leave its passes (``settle_memory``)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def stop_grace_option() -> Any:
    """``--stop-grace`` of ``opod up`` and ``opod join``: one option, one help text."""
    return typer.Option(
        None,
        "--stop-grace",
        metavar="SECONDS",
        min=0,
        max=3600,
        show_default=False,
        help="Seconds requests in flight may take to finish on Ctrl-C or SIGTERM [default: 30, or OPOD_STOP_GRACE].",
    )


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("uvicorn.error", "uvicorn.access", "httpx", "aiohttp.access", "gguf", "gguf.gguf_writer", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/] {message}")
    return typer.Exit(code)


def admin_url() -> str:
    """``OPOD_ADMIN_URL``; else the address this machine's leader listens on (``OPOD_ADMIN_LISTEN``, 127.0.0.1:9090)."""
    url = config.read("OPOD_ADMIN_URL")
    if url:
        return url.rstrip("/")
    host, _, port = (config.read("OPOD_ADMIN_LISTEN") or "127.0.0.1:9090").rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):  # a leader listening everywhere answers on loopback too
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def admin_key() -> str:
    key = config.read("OPOD_ADMIN_KEY")
    if key:
        return key
    path = config.home() / "admin.key"
    if not path.exists():
        raise fail(
            f"no admin key: {path} does not exist. Run this on the leader's machine (after opod up), or set OPOD_ADMIN_KEY."
        )
    return path.read_text().strip()


def call(method: str, path: str, body: Any = None) -> Any:
    """Call the leader's management API; a refusal or an unreachable leader exits with its reason."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(admin_url() + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {admin_key()}")
    if data is not None or method not in ("GET", "HEAD"):
        request.add_header("Content-Type", "application/json")  # the admin listener refuses a change without it
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        try:
            message = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            message = text.strip() or error.reason
        raise fail(f"{message} (HTTP {error.code})") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise fail(
            f"cannot reach the leader's admin API at {admin_url()}: {reason}. Is opod up running? (OPOD_ADMIN_URL names another)"
        ) from None
    return json.loads(text) if text else None
