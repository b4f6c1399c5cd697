"""``opod ctl quotas …``, ``opod ctl jobs …`` and ``opod ctl notify test``: capacity quotas, clients' batch jobs, webhooks."""

from __future__ import annotations

import json

import typer

from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.cli.ctl.people import when
from opod.contract.admin.common import Removed
from opod.contract.admin.records import JobView, NotifyResult
from opod.contract.admin.tenancy import QuotaAmount, QuotaRequest, QuotaSet, QuotaView, StoreResources

quotas = typer.Typer(
    help="Capacity quotas per scope: a guarantee kept free for it and a limit it cannot pass.", no_args_is_help=True
)
jobs = typer.Typer(help="Clients' batch jobs (OpenAI's Batch API): list, show, cancel.", no_args_is_help=True)
notify = typer.Typer(help="Webhooks named in the settings.", no_args_is_help=True)

SCOPE = typer.Argument(..., metavar="SCOPE", help="org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID.")


def _resources(r: StoreResources | None) -> str:
    """``2 gpus, 16 cpu cores, 64 GB``; ``-`` when not governed."""
    if r is None:
        return render.DASH
    parts = [
        f"{r.gpus} gpus" if r.gpus is not None else "",
        f"{r.cpu_cores} cpu cores" if r.cpu_cores is not None else "",
        f"{r.memory_gb} GB" if r.memory_gb is not None else "",
    ]
    return ", ".join(p for p in parts if p) or "none"


def _holds(a: QuotaAmount | None) -> str:
    if a is None:
        return render.DASH
    return f"{a.GPUs or 0} gpus, {a.CPUCores or 0} cpu cores, {a.MemoryGB or 0} GB"


@quotas.command("ls")
def list_quotas(as_json: bool = render.json_option()) -> None:
    """Every capacity quota, with what its scope holds now."""
    body = request("GET", path("quotas"))
    if as_json:
        return emit_json(body)
    rows = parse_list(QuotaView, body, "GET /api/v1/quotas")
    shown = render.table("SCOPE", "NAME", "GUARANTEE", "LIMIT", "HOLDS", "UPDATED BY", "UPDATED")
    for q in rows:
        shown.add_row(
            q.scope or render.DASH,
            q.name or render.DASH,
            _resources(q.guarantee),
            _resources(q.limit),
            _holds(q.holds),
            q.updated_by or render.DASH,
            when(q.updated_at),
        )
    render.show(shown)
    if not rows:
        render.note("no quotas: every scope is ungoverned (opod ctl quotas set team:ORG/TEAM --gpus 4)")


def _amount(gpus: int | None, cpu: int | None, memory: int | None) -> StoreResources | None:
    if gpus is None and cpu is None and memory is None:
        return None
    return StoreResources(gpus=gpus, cpu_cores=cpu, memory_gb=memory)


@quotas.command("set")
def set_quota(
    scope: str = SCOPE,
    gpus: int | None = typer.Option(None, "--gpus", help="Limit: GPUs the scope may hold."),
    cpu_cores: int | None = typer.Option(None, "--cpu-cores", help="Limit: CPU cores."),
    memory_gb: int | None = typer.Option(None, "--memory-gb", help="Limit: memory in GB."),
    guarantee_gpus: int | None = typer.Option(
        None, "--guarantee-gpus", help="Guarantee: GPUs kept free for the scope."
    ),
    guarantee_cpu_cores: int | None = typer.Option(None, "--guarantee-cpu-cores", help="Guarantee: CPU cores."),
    guarantee_memory_gb: int | None = typer.Option(None, "--guarantee-memory-gb", help="Guarantee: memory in GB."),
    as_json: bool = render.json_option(),
) -> None:
    """Set a scope's quota; it replaces the quota whole (what is left out is ungoverned)."""
    asked = QuotaRequest(
        scope=scope,
        limit=_amount(gpus, cpu_cores, memory_gb),
        guarantee=_amount(guarantee_gpus, guarantee_cpu_cores, guarantee_memory_gb),
    )
    if asked.limit is None and asked.guarantee is None:
        raise typer.BadParameter(
            "give a limit (--gpus, --cpu-cores, --memory-gb) or a guarantee (--guarantee-gpus, ...); "
            "opod ctl quotas rm SCOPE removes a quota",
            param_hint="SCOPE",
        )
    body = request("PUT", path("quotas"), wire(asked))
    if as_json:
        return emit_json(body)
    done = parse(QuotaSet, body, "PUT /api/v1/quotas")
    limit = f"limit {_resources(asked.limit)}" if asked.limit else "no limit"
    guarantee = f"guarantee {_resources(asked.guarantee)}" if asked.guarantee else "no guarantee"
    render.line(f"quota of {done.scope or scope}: {limit}; {guarantee}")


@quotas.command("rm")
def remove_quota(scope: str = SCOPE, as_json: bool = render.json_option()) -> None:
    """Remove a scope's quota: it is ungoverned again."""
    body = request("DELETE", path("quotas", scope))
    if as_json:
        return emit_json(body)
    parse(Removed, body, "DELETE /api/v1/quotas/{scope}")
    render.line(f"removed the quota of {scope}")


def _progress(value: object) -> str:
    """A batch's progress as OpenAI counts it (``{"total": 200, "completed": 50, "failed": 0}``), else as given."""
    if isinstance(value, dict) and "total" in value:
        failed = f", {value.get('failed', 0)} failed" if value.get("failed") else ""
        return f"{value.get('completed', 0)}/{value['total']}{failed}"
    return render.DASH if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)


@jobs.command("ls")
def list_jobs(
    status: str | None = typer.Option(
        None, "--status", help="queued, running, cancelling, completed, failed, cancelled, expired."
    ),
    limit: int | None = typer.Option(None, "--limit", help="The most jobs to list [default: 50]."),
    as_json: bool = render.json_option(),
) -> None:
    """Clients' jobs of every owner, newest first."""
    body = request("GET", path("client-jobs"), query={"status": status, "limit": limit})
    if as_json:
        return emit_json(body)
    rows = parse_list(JobView, body, "GET /api/v1/client-jobs")
    shown = render.table(
        "ID", "STATUS", "PROGRESS", "ENDPOINT", "MODEL", "OWNER", "KEY", "CREATED", "ERROR", wrap=["ERROR"]
    )
    for j in rows:
        shown.add_row(
            j.id or render.DASH,
            j.status or render.DASH,
            _progress(j.progress),
            j.endpoint or render.DASH,
            j.model or render.DASH,
            j.owner or render.DASH,
            j.key_id or render.DASH,
            when(j.created_at),
            j.error or render.DASH,
        )
    render.show(shown)
    if not rows:
        render.note("no jobs: clients send them with the openai package's files.create and batches.create on /v1")


def _show_job(j: JobView) -> None:
    render.show(
        render.pairs(
            [
                ("id", j.id),
                ("status", j.status),
                ("progress", _progress(j.progress) if j.progress is not None else None),
                ("endpoint", j.endpoint),
                ("model", j.model),
                ("owner", j.owner),
                ("key", j.key_id),
                ("output file", j.output_file_id),
                ("content type", j.content_type),
                ("created", when(j.created_at) if j.created_at else None),
                ("started", j.started_at),
                ("finished", j.finished_at),
                ("error", j.error),
            ]
        )
    )


@jobs.command("show")
def show_job(
    job: str = typer.Argument(..., metavar="ID", help="A job's ID (opod ctl jobs ls)."),
    as_json: bool = render.json_option(),
) -> None:
    """One job: status, progress, its output file."""
    body = request("GET", path("client-jobs", job))
    if as_json:
        return emit_json(body)
    _show_job(parse(JobView, body, "GET /api/v1/client-jobs/{id}"))


@jobs.command("cancel")
def cancel_job(
    job: str = typer.Argument(..., metavar="ID", help="A job's ID (opod ctl jobs ls)."),
    as_json: bool = render.json_option(),
) -> None:
    """Cancel a job; its lines waiting in the engines' queues are dropped too."""
    body = request("POST", path("client-jobs", job, "cancel"))
    if as_json:
        return emit_json(body)
    view = parse(JobView, body, "POST /api/v1/client-jobs/{id}/cancel")
    render.line(f"{view.id or job}: {view.status or 'cancelling'}")


@notify.command("test")
def test_webhooks(as_json: bool = render.json_option()) -> None:
    """Send a test event to every webhook in the settings; each one's answer."""
    body = request("POST", path("notify", "test"))
    if as_json:
        return emit_json(body)
    rows = parse_list(NotifyResult, body, "POST /api/v1/notify/test")
    shown = render.table("WEBHOOK", "RESULT", wrap=["RESULT"])
    for r in rows:
        shown.add_row(r.url or render.DASH, r.error or "delivered")
    render.show(shown)
    if not rows:
        render.note("no webhooks in the settings: add them under webhooks: (opod ctl settings edit)")
