"""``opod ctl plan``, ``opod ctl serve`` and ``opod ctl serve-jobs …``: a registry repository planned, served, followed."""

from __future__ import annotations

import time

import typer
from rich.status import Status

from opod.cli.common import err
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.models import ModelserveJob, ModelservePlan, ModelserveRequest

serve_jobs = typer.Typer(
    help="Serve jobs: repositories being fetched, placed, started and tried.", no_args_is_help=True
)

FOLLOW_EVERY = 0.5
"""Seconds between looks at a job while ``opod ctl serve`` follows it."""


def _where(cpu: bool | None, gpu_class: str | None, cards: int | None) -> str:
    return "CPU" if cpu else f"{cards or 1}× {gpu_class}"


def plan(
    repo: str = typer.Argument(..., help="The registry repository, owner/name."),
    form: str | None = typer.Option(
        None, "--format", help="gguf (llama.cpp) or safetensors (vLLM, SGLang) [default: gguf]."
    ),
    context: int | None = typer.Option(None, "--context", help="The context to plan for, in tokens [default: 4096]."),
    as_json: bool = render.json_option(),
) -> None:
    """Every way a repository's files could run on this fleet, best first, with the memory each needs."""
    body = request("GET", path("plan"), query={"repo": repo, "format": form, "context": context})
    if as_json:
        return emit_json(body)
    view = parse(ModelservePlan, body, "GET /api/v1/plan")
    licence = view.license or "not said"
    render.line(
        f"{view.repo}@{(view.revision or '')[:12]}: {view.architecture or 'architecture unknown'}, "
        f"{view.params or 0:,} parameters, licence {licence}{', gated' if view.gated else ''}, "
        f"at {view.context} tokens"
    )
    shown = render.table("FILE", "QUANT", "SIZE", "ENGINE", "WHERE", "NEEDS GB", "HAS GB", "HOSTS", "FREE NOW")
    for option in view.options or []:
        shown.add_row(
            option.artifact or render.DASH,
            render.text(next((a.quant for a in view.artifacts or [] if a.name == option.artifact), None)),
            render.size(next((a.bytes for a in view.artifacts or [] if a.name == option.artifact), None)),
            option.engine or render.DASH,
            _where(option.cpu, option.gpu_class, option.gpus_per_node),
            f"{option.need_gb or 0:g}",
            f"{option.have_gb or 0:g}",
            render.text(option.hosts),
            render.text(option.free_now),
        )
    if view.options:
        render.show(shown)
    if not view.servable:
        render.note(f"not servable here: {view.reason}")
    if view.note:
        render.note(view.note)


def _steps(job: ModelserveJob) -> None:
    shown = render.table("STEP", "STATE", "DETAIL", wrap=["DETAIL"])
    for step in job.steps or []:
        shown.add_row(step.name or render.DASH, step.state or render.DASH, step.detail or render.DASH)
    render.show(shown)


def _ending(job: ModelserveJob) -> None:
    if job.state == "succeeded" and job.kind in ("update", "promote"):
        render.line(f"{job.model} moved: {next((s.detail for s in job.steps or [] if s.name == 'take over'), '')}")
    elif job.state == "succeeded":
        speed = f" at {job.tokens_per_second:g} tokens/s" if job.tokens_per_second else ""
        render.line(f"{job.model} serves; its smoke test answered{speed}: {job.reply or ''}")
    elif job.error:
        render.line(f"job {job.id} {job.state}: {job.error}")


def serve(
    repo: str = typer.Argument(..., help="The registry repository, owner/name."),
    name: str | None = typer.Option(None, "--name", help="The model's name [default: from the repository]."),
    quant: str | None = typer.Option(None, "--quant", help="The quantisation to serve [default: Q4_K_M]."),
    file: str | None = typer.Option(None, "--file", help="The file to serve, instead of --quant."),
    form: str | None = typer.Option(None, "--format", help="gguf or safetensors [default: gguf]."),
    cpu: bool | None = typer.Option(
        None, "--cpu/--gpu", help="Run it on the CPU, or on GPUs [default: the plan's best]."
    ),
    gpu_class: str | None = typer.Option(None, "--gpu-class", help="The GPU class to run it on."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs of that class on its node."),
    replicas: int | None = typer.Option(None, "--replicas", help="Replicas to run; 0 loads it on demand [default: 1]."),
    context: int | None = typer.Option(None, "--context", help="The context one request may use, in tokens."),
    fallbacks: bool = typer.Option(False, "--fallbacks", help="Add the next best ways as lower-priority profiles."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Show the job's progress until it ends."),
    as_json: bool = render.json_option(),
) -> None:
    """Fetch a registry repository, place it, start it and try it; the job's steps are shown as they go."""
    asked = ModelserveRequest(
        repo=repo,
        name=name,
        quant=quant,
        file=file,
        format=form,
        cpu=cpu,
        gpu_class=gpu_class,
        gpus_per_node=gpus,
        replicas=replicas,
        context_length=context,
        fallbacks=fallbacks or None,
    )
    body = request("POST", path("models", "serve"), wire(asked))
    follow_job(body, "POST /api/v1/models/serve", follow=follow, as_json=as_json)


def follow_job(body: object, call: str, *, follow: bool, as_json: bool) -> ModelserveJob:
    """A job just started (``body``, the answer to ``call``): its progress shown until it ends, then its steps and
    how it ended; exits 1 when it did not succeed."""
    job = parse(ModelserveJob, body, call)
    if not follow:
        emit_json(body) if as_json else _steps(job)
        return job
    with Status(f"job {job.id}: starting", console=err) as status:
        while job.state == "running":
            time.sleep(FOLLOW_EVERY)
            body = request("GET", path("jobs", job.id or ""))
            job = parse(ModelserveJob, body, "GET /api/v1/jobs/{id}")
            step = next((s for s in job.steps or [] if s.state == "running"), None)
            if step is not None:
                status.update(f"job {job.id}: {step.name}: {render.printable(step.detail or '')}")
    if as_json:
        emit_json(body)
    else:
        _steps(job)
        _ending(job)
    if job.state != "succeeded":
        raise typer.Exit(1)
    return job


@serve_jobs.command("ls")
def list_jobs(as_json: bool = render.json_option()) -> None:
    """Every job (serve, update, canary, promote), the newest first."""
    body = request("GET", path("jobs"))
    if as_json:
        return emit_json(body)
    shown = render.table("ID", "KIND", "MODEL", "REPO", "STATE", "STEP", "STARTED", "ERROR", wrap=["ERROR"])
    jobs = parse_list(ModelserveJob, body, "GET /api/v1/jobs")
    for job in jobs:
        step = next((s for s in job.steps or [] if s.state in ("running", "failed")), None)
        shown.add_row(
            job.id or render.DASH,
            job.kind or "serve",
            job.model or render.DASH,
            (job.request.repo if job.request else None) or render.DASH,
            job.state or render.DASH,
            (step.name if step else None) or render.DASH,
            render.text(job.started),
            job.error or render.DASH,
        )
    if jobs:
        render.show(shown)
    else:
        render.note("no jobs: opod ctl serve OWNER/NAME starts one")


@serve_jobs.command("show")
def show_job(job_id: str = typer.Argument(..., help="The job's ID."), as_json: bool = render.json_option()) -> None:
    """One job's steps, its reply and its error."""
    body = request("GET", path("jobs", job_id))
    if as_json:
        return emit_json(body)
    job = parse(ModelserveJob, body, "GET /api/v1/jobs/{id}")
    render.line(f"job {job.id}: {job.model} from {job.request.repo if job.request else '?'}, {job.state}")
    _steps(job)
    _ending(job)
