"""``opod ctl usage``, ``opod ctl usage export`` and ``opod ctl audit``: what was spent, by whom, and what was changed.

An export is written as it arrives, a piece at a time, into ``FILE.part`` and renamed to ``FILE``
at its end, so a year of rows is never held in memory and a broken export never looks whole; without
``--out`` (or with ``--out -``) it goes to standard output as it arrives, and its progress to standard error.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path
from typing import BinaryIO

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from opod.cli.common import err, fail
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, open_stream, parse_list, path, request
from opod.cli.ctl.people import when
from opod.contract.admin.records import ScopeUsageView, StoreAuditEvent

usage = typer.Typer(
    help="Spend by organization, team or project; usage export writes totals by period to a file (CSV or JSON).",
    invoke_without_command=True,
)

CHUNK = 64 * 1024
DIMENSIONS = ("org", "team", "project", "user", "key", "model")
_JSON_MARKS = re.compile(rb'[{}\[\]"\\]')


def money(micros: int | None) -> str:
    """Micros of the price's currency as an amount: ``1.234567``; ``-`` when nothing was priced."""
    if micros is None:
        return render.DASH
    return f"{micros / 1_000_000:.6f}".rstrip("0").rstrip(".") if micros else "0"


@usage.callback()
def spend(
    context: typer.Context,
    by: str | None = typer.Option(None, "--by", help="org, team or project [default: team]."),
    since: str | None = typer.Option(None, "--since", help="A duration back from now: 90m, 24h, 7d [default: 24h]."),
    as_json: bool = render.json_option(),
) -> None:
    """What each group of the tenancy tree spent: requests, tokens, cost, and its budget where that level sets one."""
    if context.invoked_subcommand is not None:
        return
    body = request("GET", path("usage"), query={"by": by, "since": since})
    if as_json:
        return emit_json(body)
    rows = parse_list(ScopeUsageView, body, "GET /api/v1/usage")
    shown = render.table(
        "SCOPE", "NAME", "KEYS", "REQUESTS", "PROMPT", "COMPLETION", "COST", "ERRORS", "BUDGET", "USED", "LAST"
    )
    for u in rows:
        budget = f"{money(u.budget_micros)}/{u.budget_period}" if u.budget_micros else render.DASH
        used = f"{u.fraction * 100:.1f}%" if u.fraction is not None and u.budget_micros else render.DASH
        shown.add_row(
            u.id or u.scope or render.DASH,
            u.name or render.DASH,
            render.text(u.keys or 0),
            render.text(u.requests or 0),
            render.text(u.prompt_tokens or 0),
            render.text(u.completion_tokens or 0),
            money(u.cost_micros or 0),
            render.text(u.errors or 0),
            budget,
            used,
            when(u.last_at),
        )
    render.show(shown)
    if not rows:
        render.note(f"no usage in the last {since or '24h'}")


class RowCounter:
    """Counts rows as the bytes go by: CSV lines after the header, or the objects of a JSON array."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.rows = 0
        self._lines = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, chunk: bytes) -> None:
        if not self.as_json:
            self._lines += chunk.count(b"\n")
            self.rows = max(self._lines - 1, 0)
            return
        for mark in _JSON_MARKS.finditer(chunk):
            c = mark.group()
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == b"\\":
                    self._escaped = True
                elif c == b'"':
                    self._in_string = False
                continue
            if c == b'"':
                self._in_string = True
            elif c in (b"{", b"["):
                self._depth += 1
                if c == b"{" and self._depth == 2:
                    self.rows += 1
            elif c in (b"}", b"]"):
                self._depth -= 1

    def finish(self, last: bytes) -> None:
        """A CSV whose last row has no newline still counts that row."""
        if not self.as_json and last and not last.endswith(b"\n"):
            self._lines += 1
            self.rows = max(self._lines - 1, 0)


@usage.command("export")
def export(
    out_file: str = typer.Option(
        "-", "--out", help="The file to write (replaced when the export is whole); - is standard output."
    ),
    since: str | None = typer.Option(
        None, "--from", help="A date (2026-09-01) or an RFC 3339 time [default: the 1st of this month]."
    ),
    until: str | None = typer.Option(None, "--to", help="A date or an RFC 3339 time [default: now]."),
    period: str | None = typer.Option(None, "--period", help="hour, day or month [default: day]."),
    by: str | None = typer.Option(
        None, "--by", help="Dimensions, comma-separated: org, team, project, user, key, model."
    ),
    form: str = typer.Option("csv", "--format", help="csv or json."),
) -> None:
    """Usage totals by period and dimension, streamed into a file (or to standard output) with a progress bar."""
    if form not in ("csv", "json"):
        raise typer.BadParameter(f"{form!r}: write csv or json", param_hint="--format")
    if by:
        unknown = [d for d in (p.strip() for p in by.split(",")) if d not in DIMENSIONS]
        if unknown:
            raise typer.BadParameter(
                f"{', '.join(unknown)}: the dimensions are {', '.join(DIMENSIONS)}", param_hint="--by"
            )
    query = {"from": since, "to": until, "period": period, "by": by, "format": "json" if form == "json" else None}
    to_stdout = out_file == "-"
    target = Path(out_file)
    partial = target.with_name(target.name + ".part")
    counter = RowCounter(form == "json")
    response = open_stream(path("usage", "export"), query, accept="application/json" if form == "json" else "text/csv")
    total = response.headers.get("Content-Length")
    written, last = 0, b""
    progress = Progress(
        TextColumn("[bold]export[/]"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[rows]} rows"),
        TimeElapsedColumn(),
        console=err,
    )
    try:
        with response, progress, contextlib.ExitStack() as held:
            sink: BinaryIO = sys.stdout.buffer if to_stdout else held.enter_context(partial.open("wb"))
            task = progress.add_task("export", total=int(total) if total else None, rows=0)
            while chunk := response.read(CHUNK):
                sink.write(chunk)
                counter.feed(chunk)
                written += len(chunk)
                last = chunk
                progress.update(task, completed=written, rows=counter.rows)
            sink.flush()
            counter.finish(last)
            progress.update(task, completed=written, total=written, rows=counter.rows)
        if not to_stdout:
            os.replace(partial, target)
    except OSError as error:
        if to_stdout:
            raise fail(f"the export broke off after {render.size(written)}: {error}") from None
        partial.unlink(missing_ok=True)
        raise fail(f"the export broke off after {render.size(written)}: {error}; {target} was not written") from None
    where = "standard output" if to_stdout else str(target)
    render.err_note(f"wrote {render.count(counter.rows, 'row')} ({render.size(written)}) to {where}")


def audit(
    since: str | None = typer.Option(None, "--since", help="How far back: 90m, 24h, 7d [default: 7d]."),
    limit: int | None = typer.Option(None, "--limit", help="The most events to show."),
    actor: str | None = typer.Option(None, "--actor", help="Only changes by this actor."),
    contains: str | None = typer.Option(None, "--contains", help="Only events whose action or target contains this."),
    as_json: bool = render.json_option(),
) -> None:
    """Changes made through the API, the CLI or the console, newest first; secrets are never in a detail."""
    body = request("GET", path("audit"), query={"since": since, "limit": limit, "actor": actor, "contains": contains})
    if as_json:
        return emit_json(body)
    rows = parse_list(StoreAuditEvent, body, "GET /api/v1/audit")
    shown = render.table("AT", "ACTOR", "SOURCE", "ACTION", "TARGET", "STATUS", "DETAIL", wrap=["DETAIL"])
    for e in rows:
        # A path, and so an action or target, holds what the caller sent: a line break in it is escaped too.
        shown.add_row(
            *(
                render.printable(cell)
                for cell in (
                    when(e.at),
                    e.actor or render.DASH,
                    e.source or render.DASH,
                    e.action or render.DASH,
                    e.target or render.DASH,
                    render.text(e.status),
                    e.detail or render.DASH,
                )
            )
        )
    render.show(shown)
    if not rows:
        render.note(f"no changes in the last {since or '7d'}")
