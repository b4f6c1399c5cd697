"""``opod ctl updates`` and ``opod ctl models update|rollback|origin``: models moved to newer weights, or back."""

from __future__ import annotations

from pathlib import Path

import typer

from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.cli.ctl.serving import follow_job
from opod.contract.admin.models import (
    CheckRequest,
    EvalRequest,
    ModelserveChange,
    ModelserveUpdateInfo,
    OriginRequest,
    OriginView,
    Result,
)

MODEL = typer.Argument(..., metavar="MODEL", help="The model's name in the catalog (opod ctl models ls).")


def _commit(value: str | None) -> str:
    return (value or "")[:12] or render.DASH


def updates(
    check: bool = typer.Option(False, "--check", help="Ask the registry now, rather than show the last answers."),
    model: str | None = typer.Option(None, "--model", help="With --check: ask about this model only."),
    as_json: bool = render.json_option(),
) -> None:
    """Newer weights the registry has for the models served from it: the commit running, the latest, what changed."""
    if check:
        body = request("POST", path("updates", "check"), wire(CheckRequest(model=model)))
    else:
        body = request("GET", path("updates"))
    if as_json:
        return emit_json(body)
    infos = parse_list(ModelserveUpdateInfo, body, "GET /api/v1/updates")
    shown = render.table(
        "MODEL", "REPO", "RUNS", "LATEST", "UPDATE", "CHANGED", "TO FETCH", "PREVIOUS", wrap=["CHANGED"]
    )
    for info in infos:
        verdict = "not checked" if info.checked_at is None else "available" if info.available else "none"
        shown.add_row(
            info.model or render.DASH,
            info.repo or render.DASH,
            _commit(info.current),
            _commit(info.latest),
            verdict if not info.error else f"none: {info.error}",
            ", ".join(info.changed or []) or render.DASH,
            render.size(info.bytes) if info.bytes else render.DASH,
            _commit(info.previous),
        )
    if infos:
        render.show(shown)
    else:
        render.note("no model has an origin: opod ctl serve OWNER/NAME serves one from the registry")


def update(
    name: str = MODEL,
    suite: str | None = typer.Option(None, "--suite", help="Hold the new weights to this suite, not the model's gate."),
    suite_file: Path | None = typer.Option(
        None, "--suite-file", exists=True, dir_okay=False, help="Hold them to the suite in this file instead."
    ),
    min_score: float | None = typer.Option(None, "--min-score", help="The score, 0 to 1, the suite needs."),
    skip_eval: bool = typer.Option(False, "--skip-eval", help="Move without the model's eval gate (the job says so)."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Show the job's progress until it ends."),
    as_json: bool = render.json_option(),
) -> None:
    """Move MODEL to its repository's latest weights: they start beside the old, pass its gate, then take over."""
    sent = None
    if suite or suite_file or min_score is not None:
        content = suite_file.read_text() if suite_file is not None else None
        sent = EvalRequest(
            suite=suite,
            content=content,
            file=suite_file.name if suite_file is not None else None,
            min_score=min_score,
        )
    change = ModelserveChange(eval=sent, skip_eval=skip_eval or None)
    body = request("POST", path("models", name, "update"), wire(change))
    follow_job(body, "POST /api/v1/models/{name}/update", follow=follow, as_json=as_json)


def rollback(name: str = MODEL, as_json: bool = render.json_option()) -> None:
    """Move MODEL back to the weights its last update replaced, beside the running ones."""
    body = request("POST", path("models", name, "rollback"))
    if as_json:
        return emit_json(body)
    render.line(parse(Result, body, "POST /api/v1/models/{name}/rollback").result or "")


def origin(
    name: str = MODEL,
    repo: str = typer.Argument(..., metavar="REPO", help="The registry repository its weights came from, owner/name."),
    as_json: bool = render.json_option(),
) -> None:
    """Record the repository weights added by hand came from, so their updates can be found."""
    body = request("POST", path("models", name, "origin"), wire(OriginRequest(repo=repo)))
    if as_json:
        return emit_json(body)
    view = parse(OriginView, body, "POST /api/v1/models/{name}/origin")
    running = f"at {_commit(view.revision)}" if view.revision else "at a commit not known (its digest matches none)"
    render.line(f"{name} comes from {view.repo} {running}")
