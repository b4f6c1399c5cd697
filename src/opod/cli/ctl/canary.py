"""``opod ctl models canary …``: a share of a model's requests sent to a candidate, rolled back by itself when worse."""

from __future__ import annotations

import typer

from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.cli.ctl.serving import follow_job
from opod.contract.admin.catalog import CatalogCanary
from opod.contract.admin.models import (
    CanaryPercentRequest,
    CanarySide,
    ModelserveCanaryView,
    ModelserveChange,
    ModelserveJob,
    Result,
)

canary = typer.Typer(
    help="Canaries: a share of a model's requests sent to a candidate model (0: a copy of each, in shadow), "
    "rolled back by itself when its errors or time to the first token are worse; set, share, rm, ls, promote.",
    no_args_is_help=True,
)
MODEL = typer.Argument(..., metavar="MODEL", help="The model clients name (opod ctl models ls).")


def _job(job: ModelserveJob) -> None:
    if job.kind == "canary" and job.state == "succeeded":  # the job set the canary; `ls` follows how it serves
        render.line(f"canary of {job.model} set (job {job.id}); opod ctl models canary ls follows both sides")
    else:
        render.line(f"{job.kind} of {job.model}: {job.state}" + (f" ({job.error})" if job.error else ""))
    for step in job.steps or []:
        render.line(f"  {step.name}: {step.state}" + (f" — {step.detail}" if step.detail else ""))


def _side(side: CanarySide | None) -> str:
    if side is None or not side.requests:
        return render.DASH
    ttft = f", ttft {side.ttft_ms:.0f} ms" if side.ttft_count else ""
    return f"{side.errors or 0}/{side.requests} failed{ttft}"


@canary.command("set")
def set_canary(
    name: str = MODEL,
    candidate: str = typer.Argument(..., metavar="CANDIDATE", help="The candidate: another model of the catalog."),
    percent: int = typer.Option(0, "--percent", min=0, max=100, help="Its share of requests; 0 runs it in shadow."),
    min_requests: int | None = typer.Option(None, "--min-requests", help="Judged over at least this many (50)."),
    max_error_increase: float | None = typer.Option(
        None, "--max-error-increase", help="Rolled back at this much more error rate than the model's (0.05)."
    ),
    max_ttft_ratio: float | None = typer.Option(
        None, "--max-ttft-ratio", help="Rolled back at this many times the model's time to the first token (1.5)."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Start a canary of MODEL: CANDIDATE takes --percent of its requests, and clients cannot name it meanwhile."""
    body = CatalogCanary(
        model=candidate,
        percent=percent,
        min_requests=min_requests,
        max_error_increase=max_error_increase,
        max_ttft_ratio=max_ttft_ratio,
    )
    answer = request("POST", path("models", name, "canary"), wire(body))
    if as_json:
        return emit_json(answer)
    _job(parse(ModelserveJob, answer, "POST /api/v1/models/{name}/canary"))


@canary.command("share")
def share(
    name: str = MODEL,
    percent: int = typer.Argument(..., metavar="PERCENT", min=0, max=100, help="0 to 100; 0 runs it in shadow."),
    as_json: bool = render.json_option(),
) -> None:
    """Change the share of MODEL's requests its canary takes (judged afresh from now)."""
    answer = request("PUT", path("models", name, "canary"), wire(CanaryPercentRequest(percent=percent)))
    if as_json:
        return emit_json(answer)
    render.line(parse(Result, answer, "PUT /api/v1/models/{name}/canary").result or "done")


@canary.command("rm")
def remove(name: str = MODEL, as_json: bool = render.json_option()) -> None:
    """Take MODEL's canary out: its share first, then the candidate."""
    answer = request("DELETE", path("models", name, "canary"))
    if as_json:
        return emit_json(answer)
    render.line(parse(Result, answer, "DELETE /api/v1/models/{name}/canary").result or "done")


@canary.command("ls")
def list_canaries(as_json: bool = render.json_option()) -> None:
    """Every canary: its candidate, share, and how each side served since it was set or changed."""
    answer = request("GET", path("canaries"))
    if as_json:
        return emit_json(answer)
    rows = parse_list(ModelserveCanaryView, answer, "GET /api/v1/canaries")
    shown = render.table("MODEL", "CANDIDATE", "SHARE", "MODEL SERVED", "CANDIDATE SERVED")
    for row in rows:
        c, serving = row.canary or CatalogCanary(), row.serving
        shown.add_row(
            row.model or render.DASH,
            c.model or render.DASH,
            f"{c.percent}%" if c.percent else "shadow",
            _side(serving.stable if serving else None),
            _side(serving.candidate if serving else None),
        )
    render.show(shown)
    if not rows:
        render.note("no canaries: opod ctl models canary set MODEL CANDIDATE --percent 10 starts one")


@canary.command("promote")
def promote(
    name: str = MODEL,
    skip_eval: bool = typer.Option(False, "--skip-eval", help="Move without the model's eval gate; the job says so."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Show the job's progress until it ends."),
    as_json: bool = render.json_option(),
) -> None:
    """Make MODEL's candidate weights the model's, held to its eval gate unless --skip-eval."""
    answer = request("POST", path("models", name, "promote"), wire(ModelserveChange(skip_eval=skip_eval or None)))
    follow_job(answer, "POST /api/v1/models/{name}/promote", follow=follow, as_json=as_json)
