"""``opod ctl settings show|edit|history|rollback``: the cluster's settings, a versioned YAML body.

A change names the version it was made on (its base); when another change came first the leader
refuses it with 409, and the command says which version is the newest, keeping the edit in a file.
``show`` writes the version it shows as the body's first line (a YAML comment), so a file made with
``show > FILE`` carries its base to ``edit --file FILE``; a file without that line needs ``--base``.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import click
import typer
from rich.markup import escape

from opod.cli.common import fail
from opod.cli.ctl import render
from opod.cli.ctl.api import attempt, emit_json, parse, parse_list, path, request, wire
from opod.cli.ctl.people import when
from opod.contract.admin.records import SettingsRequest, SettingsRollbackRequest, SettingsView

settings = typer.Typer(
    help="The cluster's settings: prices, budgets, retention, webhooks, Prometheus, key rules, sign-in, guard policies.",
    no_args_is_help=True,
)


BASE_LINE = "# opod settings version {version}: opod ctl settings edit --file takes this version as its base\n"
_BASE = re.compile(r"# opod settings version (\d+)\b[^\n]*\n?")


def _with_base(body: str, version: int) -> str:
    """The body as ``show`` writes it and the editor opens it: the version it is, in its first line."""
    return BASE_LINE.format(version=version) + body


def _base_of(text: str) -> tuple[int | None, str]:
    """The version a ``show`` output records in its first line (``None`` when it has none), and the body after it."""
    found = _BASE.match(text)
    if found is None:
        return None, text
    return int(found.group(1)), text[found.end() :]


def _about(view: SettingsView) -> str:
    if not view.version:
        return "version 0: nothing written yet, every default is in force"
    return (
        f"version {view.version}"
        + (f" by {view.by}" if view.by else "")
        + (f" at {when(view.at)}" if view.at else "")
        + (f": {view.note}" if view.note else "")
    )


def _newest() -> SettingsView:
    return parse(SettingsView, request("GET", path("settings")), "GET /api/v1/settings")


@settings.command("show")
def show(
    version: int | None = typer.Option(None, "--version", help="An earlier version [default: the newest]."),
    as_json: bool = render.json_option(),
) -> None:
    """The settings in force (or an earlier version) as YAML on standard output, the version in its first line
    (edit --file takes it as the base); who wrote it on standard error."""
    body = request("GET", path("settings"), query={"version": version})
    if as_json:
        return emit_json(body)
    view = parse(SettingsView, body, "GET /api/v1/settings")
    render.err_note(_about(view))
    if view.local_keys:
        render.err_note(f"this leader's own file overrides: {', '.join(view.local_keys)}")
    text = _with_base(view.body or "", view.version or 0)
    typer.echo(text, nl=not text.endswith("\n"))


def _edit(text: str) -> str | None:
    """The body as the operator leaves it in ``$VISUAL`` or ``$EDITOR`` (click's choice when neither is set); None if not saved."""
    try:
        return click.edit(text, extension=".yaml", require_save=True)
    except click.ClickException as error:
        raise fail(f"{error.format_message()}; set EDITOR, or give the new body with --file") from None


@settings.command("edit")
def edit(
    file: Path | None = typer.Option(
        None, "--file", exists=True, dir_okay=False, help="Put this file as the new body instead of editing."
    ),
    note: str | None = typer.Option(None, "--note", help="Why, kept with the version."),
    base: int | None = typer.Option(
        None,
        "--base",
        help="The version the new body was made from [default: the one its first line records, as settings show "
        "writes it; with $EDITOR, the newest].",
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Change the settings: opens $EDITOR on the newest body (or puts --file); in force on every leader within seconds.

    A change made since the base is never overwritten: the leader refuses it (HTTP 409)."""
    newest = _newest()
    was = newest.version or 0
    if file is not None:
        recorded, text = _base_of(file.read_text())
        if base is None and recorded is None:
            raise typer.BadParameter(
                f"{file} does not say which version it was made from, so a change made since could be overwritten: "
                "give --base VERSION (opod ctl settings history), or start from opod ctl settings show > FILE, "
                "whose first line records it",
                param_hint="--base",
            )
    else:
        edited = _edit(_with_base(newest.body or "", was))
        if edited is None:
            render.err_note(f"no change; the settings stay at {_about(newest)}")
            return
        recorded, text = _base_of(edited)
        if text == (newest.body or ""):
            render.err_note(f"no change; the settings stay at {_about(newest)}")
            return
    made_on = base if base is not None else recorded if recorded is not None else was
    status, answer = attempt("PUT", path("settings"), wire(SettingsRequest(base=made_on, body=text, note=note)))
    if status >= 400:
        kept = "" if file is not None else f"; your edit is kept in {_keep(_with_base(text, made_on), made_on)}"
        if status == 409:
            latest = _newest()
            raise fail(
                escape(f"{answer}\nthe newest is {_about(latest)}: opod ctl settings show, then edit again{kept}")
            )
        raise fail(escape(f"{answer}{kept}"))
    if as_json:
        return emit_json(answer)
    view = parse(SettingsView, answer, "PUT /api/v1/settings")
    render.line(f"settings {_about(view)} (was version {made_on})")


def _keep(text: str, version: int) -> str:
    with tempfile.NamedTemporaryFile("w", prefix=f"opod-settings-on-v{version}-", suffix=".yaml", delete=False) as kept:
        kept.write(text)
    return kept.name


@settings.command("history")
def history(
    limit: int | None = typer.Option(None, "--limit", help="How many versions [default: 20]."),
    as_json: bool = render.json_option(),
) -> None:
    """Versions of the settings, newest first."""
    body = request("GET", path("settings", "history"), query={"limit": limit})
    if as_json:
        return emit_json(body)
    rows = parse_list(SettingsView, body, "GET /api/v1/settings/history")
    shown = render.table("VERSION", "AT", "BY", "NOTE", wrap=["NOTE"])
    for v in rows:
        shown.add_row(render.text(v.version), when(v.at), v.by or render.DASH, v.note or render.DASH)
    render.show(shown)
    if not rows:
        render.note("no versions yet: every default is in force (opod ctl settings edit)")


@settings.command("rollback")
def rollback(
    version: int = typer.Argument(
        ..., metavar="VERSION", help="The version whose body to put back (opod ctl settings history)."
    ),
    note: str | None = typer.Option(None, "--note", help="Why, kept with the new version."),
    as_json: bool = render.json_option(),
) -> None:
    """Put an earlier version's body back, as a new version."""
    body = request("POST", path("settings", "rollback"), wire(SettingsRollbackRequest(version=version, note=note)))
    if as_json:
        return emit_json(body)
    view = parse(SettingsView, body, "POST /api/v1/settings/rollback")
    render.line(f"settings {_about(view)} (the body of version {version})")
