"""How ``opod ctl`` shows things: tables, key/value blocks, byte counts and Go durations."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import typer
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from opod.cli.common import err, out, print_whole

DASH = "-"

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def printable(value: str, *, lines: bool = False) -> str:
    """``value`` with every character a terminal would act on (escape sequences, carriage returns, bidirectional
    overrides) written as its Python escape (``\\x1b``), so text from the leader cannot recolour the terminal,
    move the cursor or reorder what is shown; ``lines`` keeps line breaks (a cell of several lines)."""
    if value.isprintable():
        return value
    return "".join(
        c if c.isprintable() or (lines and c == "\n") else c.encode("unicode_escape").decode("ascii") for c in value
    )


class _Cells(Table):
    """A table whose cells are text as given: a name or message holding ``[...]`` is shown, not read as markup,
    and a character a terminal would act on is shown escaped (:func:`printable`)."""

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        super().add_row(*(Text(printable(c, lines=True)) if isinstance(c, str) else c for c in cells), **kwargs)


def line(message: str) -> None:
    """A line of output as given (no markup: names and messages from the leader may hold brackets)."""
    out.print(printable(message, lines=True), markup=False)


def table(*columns: str, wrap: Iterable[str] = ()) -> Table:
    """A plain table in the style of ``opod node ls``: no box, bold headers; ``wrap`` names the columns that may fold."""
    folding = set(wrap)
    shown = _Cells(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        shown.add_column(column, no_wrap=column not in folding, overflow="fold")
    return shown


def pairs(rows: Iterable[tuple[str, Any]]) -> Table:
    """A block of ``key  value`` lines; a value that is absent is left out, so the block says only what is known."""
    grid = _Cells.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        if value is None or value == [] or value == {}:
            continue
        grid.add_row(key, text(value))
    return grid


def text(value: Any) -> str:
    """A value as a cell: lists joined with commas, maps as ``k=v``, booleans as yes/no, nothing as ``-``."""
    if value is None or value == "" or value == [] or value == {}:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return ", ".join(text(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def show(thing: RenderableType) -> None:
    """Print a table or a tree with its ids whole at any width (:func:`opod.cli.common.print_whole`)."""
    print_whole(thing)


def note(message: str) -> None:
    """A hint under a table (what to do when it is empty), dimmed."""
    out.print(f"[dim]{message}[/]")


def err_note(message: str) -> None:
    """A remark on standard error, so what a command prints on standard output stays the data alone."""
    err.print(f"[dim]{message}[/]")


def count(n: int, thing: str) -> str:
    """``1 replica``, ``3 replicas``."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def size(n_bytes: int | None) -> str:
    """Bytes as people read them: ``1.5 GiB``."""
    if n_bytes is None:
        return DASH
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n_bytes} B"


def duration(ns: int | None) -> str:
    """Nanoseconds (Go's encoding of a duration in a body) as Go writes them: ``10m0s``, ``1.5s``, ``250ms``."""
    if ns is None:
        return DASH
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= scale:
                return f"{sign}{ns / scale:g}{unit}"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = f"{rest / 1_000_000_000:g}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def parse_duration(value: str, flag: str) -> int:
    """A Go duration (``90s``, ``10m``, ``1h30m``, ``0``) as nanoseconds; a bad one is a usage error naming the flag."""
    value = value.strip()
    if value == "0":
        return 0
    at, total = 0, 0.0
    for match in _PART.finditer(value):
        if match.start() != at:
            break
        total += float(match.group(1)) * _UNITS_NS[match.group(2)]
        at = match.end()
    if at != len(value) or not value:
        raise typer.BadParameter(
            f"{value!r} is not a duration; write it as Go does: 90s, 10m, 1h30m (or 0)", param_hint=flag
        )
    return int(total)


def key_values(items: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` options as a map; one without ``=`` is a usage error naming the flag."""
    found: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: write it as KEY=VALUE", param_hint=flag)
        found[key] = value
    return found


def json_option() -> Any:
    """``--json``: the body as the API answered it, for scripts (each command gets its own option object)."""
    return typer.Option(False, "--json", help="Print the API's answer as JSON, for scripts.")
