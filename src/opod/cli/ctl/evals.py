"""``opod ctl eval …``: quality suites, runs of them against a model (with progress while one runs), eval gates."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opod.cli.common import err, fail
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.models import EvalGateRequest, EvalGateView, EvalLive, EvalRequest, EvalSuiteInfo

evals = typer.Typer(
    help="Quality suites: list them, run one against a model and follow it, see past runs, hold a model to one.",
    no_args_is_help=True,
)
gate = typer.Typer(help="A model's eval gate: the suite its updates and promotions must pass.", no_args_is_help=True)
evals.add_typer(gate, name="gate")

POLL_S = 0.5
ANSWER_SHOWN = 60


@evals.command("suites")
def suites(as_json: bool = render.json_option()) -> None:
    """The suites the leader can run by name: built in, and the eval directory's files (a broken one with why)."""
    body = request("GET", path("eval", "suites"))
    if as_json:
        return emit_json(body)
    rows = parse_list(EvalSuiteInfo, body, "GET /api/v1/eval/suites")
    shown = render.table("SUITE", "CASES", "THRESHOLD", "JUDGE", "FROM", "DESCRIPTION", wrap=["DESCRIPTION", "FROM"])
    for s in rows:
        shown.add_row(
            s.name or render.DASH,
            render.text(s.cases),
            render.text(s.threshold),
            render.text(s.judge),
            s.from_ or render.DASH,
            f"cannot be run: {s.error}" if s.error else s.description or render.DASH,
        )
    render.show(shown)


def _show_run(run: EvalLive) -> None:
    verdict = "running" if run.state == "running" else "passed" if run.passed else run.state or "failed"
    if run.state == "done" and not run.passed:
        verdict = "below its threshold"
    render.show(
        render.pairs(
            [
                ("run", run.id),
                ("model", run.model),
                ("answered by", run.target),
                ("suite", run.suite),
                ("state", verdict),
                ("score", f"{run.score or 0:.3f} (threshold {run.threshold or 0:g})"),
                (
                    "cases",
                    f"{run.done or 0} of {run.cases or 0} done, {run.below or 0} below half, {run.errors or 0} without an answer",
                ),
                ("judge", run.judge),
                ("by", run.by),
                ("took", f"{(run.took_ms or 0) / 1000:.1f}s"),
                ("error", run.error),
            ]
        )
    )
    if run.results:
        shown = render.table("CASE", "KIND", "SCORE", "PASSED", "ANSWER", "WHY", wrap=["ANSWER", "WHY"])
        for c in run.results:
            answer = (c.answer or "").replace("\n", " ")
            shown.add_row(
                c.id or render.DASH,
                c.kind or render.DASH,
                render.text(c.score),
                render.text(c.passed),
                answer[:ANSWER_SHOWN] + ("…" if len(answer) > ANSWER_SHOWN else "") or render.DASH,
                c.error or c.detail or render.DASH,
            )
        render.show(shown)


def _follow(run: EvalLive) -> EvalLive:
    """Poll the run, with a bar of its cases on standard error, until it ends."""
    where = path("eval", "runs", run.id or "")
    progress = Progress(
        TextColumn(f"[bold]{run.suite}[/] on {run.target or run.model}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("score so far {task.fields[score]:.3f}"),
        TimeElapsedColumn(),
        console=err,
    )
    with progress:
        task = progress.add_task("run", total=run.cases or None, score=0.0)
        while run.state == "running":
            time.sleep(POLL_S)
            run = parse(EvalLive, request("GET", where), "GET /api/v1/eval/runs/{id}")
            progress.update(task, completed=run.done or 0, score=run.score or 0.0)
    return run


@evals.command("run")
def run(
    model: str = typer.Argument(..., metavar="MODEL", help="The model to ask (opod ctl models ls)."),
    suite: str | None = typer.Argument(None, metavar="SUITE", help="A suite's name (opod ctl eval suites)."),
    file: Path | None = typer.Option(None, "--file", help="Run the suite in this file instead (YAML or JSON)."),
    concurrency: int | None = typer.Option(None, "--concurrency", help="Cases asked at once [default: 4]."),
    judge: str | None = typer.Option(None, "--judge", help="The model that grades rubric cases."),
    min_score: float | None = typer.Option(
        None, "--min-score", help="Pass at this score, 0 to 1 [default: the suite's]."
    ),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow the run to its end, or only start it."),
    as_json: bool = render.json_option(),
) -> None:
    """Ask a model a suite through /v1 (its usage is accounted), show progress, then each case's verdict."""
    if (suite is None) == (file is None):
        raise typer.BadParameter("name a SUITE or give --file, one of the two", param_hint="SUITE")
    content = None
    if file is not None:
        try:
            content = file.read_text(encoding="utf-8")
        except OSError as error:
            raise fail(f"cannot read {file}: {error}") from None
    ask = EvalRequest(
        suite=suite,
        content=content,
        file=str(file) if file is not None else None,
        concurrency=concurrency,
        judge=judge,
        min_score=min_score,
    )
    started = parse(
        EvalLive, request("POST", path("models", model, "eval"), wire(ask)), "POST /api/v1/models/{name}/eval"
    )
    if not wait:
        if as_json:
            return emit_json(wire(started))
        render.line(f"started {started.id}; opod ctl eval show {started.id} follows it")
        return None
    finished = _follow(started) if not as_json else _poll(started)
    if as_json:
        return emit_json(wire(finished))
    _show_run(finished)
    if finished.state != "done":
        raise typer.Exit(1)
    return None


def _poll(run: EvalLive) -> EvalLive:
    while run.state == "running":
        time.sleep(POLL_S)
        run = parse(EvalLive, request("GET", path("eval", "runs", run.id or "")), "GET /api/v1/eval/runs/{id}")
    return run


@evals.command("runs")
def runs(
    model: str | None = typer.Option(None, "--model", help="Only this model's runs."),
    limit: int | None = typer.Option(None, "--limit", help="How many [default: 20]."),
    as_json: bool = render.json_option(),
) -> None:
    """Quality runs, the newest first."""
    body = request("GET", path("eval", "runs"), query={"model": model, "limit": limit})
    if as_json:
        return emit_json(body)
    shown = render.table("RUN", "MODEL", "SUITE", "STATE", "SCORE", "THRESHOLD", "PASSED", "DONE", "AT", "BY")
    for r in parse_list(EvalLive, body, "GET /api/v1/eval/runs"):
        shown.add_row(
            r.id or render.DASH,
            r.model + (f" ({r.target})" if r.target else "") if r.model else render.DASH,
            r.suite or render.DASH,
            r.state or render.DASH,
            f"{r.score or 0:.3f}",
            render.text(r.threshold),
            render.text(r.passed),
            f"{r.done or 0}/{r.cases or 0}",
            r.at.strftime("%Y-%m-%d %H:%M:%S") if r.at else render.DASH,
            r.by or render.DASH,
        )
    render.show(shown)
    return None


@evals.command("show")
def show(
    run_id: str = typer.Argument(..., metavar="RUN", help="A run's id (opod ctl eval runs)."),
    follow: bool = typer.Option(False, "--follow", help="While it runs, show its progress until it ends."),
    as_json: bool = render.json_option(),
) -> None:
    """One run with each case: its answer, score and why."""
    body = request("GET", path("eval", "runs", run_id))
    if as_json:
        return emit_json(body)
    found = parse(EvalLive, body, "GET /api/v1/eval/runs/{id}")
    _show_run(_follow(found) if follow else found)
    return None


def _show_gate(view: EvalGateView) -> None:
    if view.eval is None or not view.eval.suite:
        render.line(f"{view.model}: no eval gate")
        return
    g = view.eval
    at = f"score {g.min_score:g}" if g.min_score else "the suite's own threshold"
    render.line(
        f"{view.model}: updates and promotions must pass suite {g.suite} at {at}"
        + (f", judged by {g.judge}" if g.judge else "")
    )


@gate.command("show")
def show_gate(model: str = typer.Argument(..., metavar="MODEL"), as_json: bool = render.json_option()) -> None:
    """The model's eval gate, as its definition holds it."""
    body = request("GET", path("models", model))
    if not isinstance(body, dict):
        raise fail(f"GET /api/v1/models/{model} answered no model")
    found = {"model": body.get("name") or model, "eval": body.get("eval")}
    view = parse(EvalGateView, {k: v for k, v in found.items() if v is not None}, "GET /api/v1/models/{name}")
    if as_json:
        return emit_json(wire(view))
    _show_gate(view)
    return None


@gate.command("set")
def set_gate(
    model: str = typer.Argument(..., metavar="MODEL"),
    suite: str = typer.Argument(..., metavar="SUITE", help="The suite to pass (opod ctl eval suites)."),
    min_score: float | None = typer.Option(
        None, "--min-score", help="The score to pass at, 0 to 1 [default: the suite's]."
    ),
    judge: str | None = typer.Option(None, "--judge", help="The model that grades its rubric cases."),
    as_json: bool = render.json_option(),
) -> None:
    """Hold the model's updates and promotions to a suite."""
    body = request(
        "PUT", path("models", model, "eval-gate"), wire(EvalGateRequest(suite=suite, min_score=min_score, judge=judge))
    )
    if as_json:
        return emit_json(body)
    _show_gate(parse(EvalGateView, body, "PUT /api/v1/models/{name}/eval-gate"))
    return None


@gate.command("remove")
def remove_gate(model: str = typer.Argument(..., metavar="MODEL"), as_json: bool = render.json_option()) -> None:
    """Stop holding the model's updates to a suite."""
    body = request("DELETE", path("models", model, "eval-gate"))
    if as_json:
        return emit_json(body)
    _show_gate(parse(EvalGateView, body, "DELETE /api/v1/models/{name}/eval-gate"))
    return None
