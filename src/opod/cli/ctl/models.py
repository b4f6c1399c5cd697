"""``opod ctl models …``: the cluster's catalog (``catalog.Model``), its scaling, class, owner and measured capacity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import ValidationError

from opod.cli.common import fail
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.catalog import CatalogModel, CatalogProfile, CatalogScaling
from opod.contract.admin.common import Removed
from opod.contract.admin.fleet import CapacityView
from opod.contract.admin.models import (
    BenchCapacity,
    ClassRequest,
    ClassView,
    FallbacksRequest,
    FallbacksView,
    HeadroomView,
    ModelAdded,
    ModelView,
    OwnerRequest,
    OwnerView,
    ResourcesRequest,
    RetryView,
    ScaleRequest,
    ScaleResponse,
    TargetView,
)

models = typer.Typer(
    help="Models of the cluster's catalog: list, show, add, remove, scale, resources, class, owner, "
    "retry, target, headroom, capacity.",
    no_args_is_help=True,
)
capacity = typer.Typer(
    help="Measured capacity of a model's profiles: record a measurement, list them.", no_args_is_help=True
)
models.add_typer(capacity, name="capacity")

NAME = typer.Argument(..., metavar="MODEL", help="A model's name (opod ctl models ls).")


def _state(view: ModelView) -> str:
    """Why a model is not as wanted, or ``ok``."""
    parts = []
    if view.parked:
        parts.append(f"parked after {view.failures or 0} failed starts" + (f": {view.reason}" if view.reason else ""))
    elif view.reason:
        parts.append(view.reason)
    if view.unplaceable and not view.reason:
        parts.append("unplaceable (opod ctl explain MODEL says why)")
    if view.preempted:
        parts.append(f"{view.preempted} preempted")
    if view.held_for:
        parts.append(f"held for {view.held_for}")
    parts += view.warnings or []
    return "\n".join(parts) or "ok"


@models.command("ls")
def list_models(as_json: bool = render.json_option()) -> None:
    """Every model: its class, replicas ready of those wanted, scaling bounds, profiles, owner and what holds it back."""
    body = request("GET", path("models"))
    if as_json:
        return emit_json(body)
    rows = parse_list(ModelView, body, "GET /api/v1/models")
    shown = render.table("MODEL", "CLASS", "READY", "MIN-MAX", "PROFILES", "OWNER", "STATE", wrap=["STATE", "PROFILES"])
    for m in rows:
        wanted = m.desired_replicas if m.desired_replicas is not None else m.total_replicas
        bounds = f"{m.min_replicas if m.min_replicas is not None else '-'}-{m.max_replicas if m.max_replicas is not None else '-'}"
        name = m.name or render.DASH
        if m.aliases:
            name += f" ({', '.join(m.aliases)})"
        shown.add_row(
            name,
            m.class_ or render.DASH,
            f"{m.ready_replicas or 0}/{wanted or 0}",
            bounds,
            render.text(m.profiles) if not m.external else f"external: {m.external}",
            m.owner or "shared",
            _state(m),
        )
    render.show(shown)
    if not rows:
        render.note(
            "no models yet: opod ctl presets ls shows what fits, opod ctl models add --file MODEL.yaml adds your own"
        )


@models.command("show")
def show_model(name: str = NAME, as_json: bool = render.json_option()) -> None:
    """One model's catalog entry with its defaults filled in: source, scaling, class, and each placement profile."""
    body = request("GET", path("models", name))
    if as_json:
        return emit_json(body)
    m = parse(CatalogModel, body, "GET /api/v1/models/{name}")
    scaling = m.scaling
    render.show(
        render.pairs(
            [
                ("model", m.name),
                ("aliases", m.aliases),
                ("description", m.description),
                ("source", m.source),
                ("class", m.class_),
                ("owner", m.owner or "shared"),
                ("role", m.role),
                ("external", m.external.model_dump(exclude_none=True) if m.external else None),
                ("scaling", _scaling(scaling) if scaling else None),
                ("context", m.context_length),
                ("max output", m.max_output),
                (
                    "capabilities",
                    [k for k, v in m.capabilities.model_dump(exclude_none=True).items() if v]
                    if m.capabilities
                    else None,
                ),
                ("fallbacks", m.fallbacks),
                ("adapters", [a.name for a in m.adapters or []]),
                ("license", m.license.id or m.license.name if m.license else None),
            ]
        )
    )
    if m.profiles:
        profiles = render.table(
            "PROFILE", "ENGINE", "GPUS", "TP×PP", "NODES", "MEMORY", "CPU", "SELECTOR", "PRIORITY", wrap=["SELECTOR"]
        )
        for p in m.profiles:
            profiles.add_row(
                p.name or render.DASH,
                (p.engine or render.DASH) + (f" {p.engine_version}" if p.engine_version else ""),
                _gpu_need(p),
                f"{p.tp or 1}×{p.pp or 1}",
                render.text(p.nodes),
                f"{p.min_memory_gb} GiB" if p.min_memory_gb else render.DASH,
                render.text(p.cpu_cores),
                render.text(p.node_selector),
                render.text(p.priority),
            )
        render.show(profiles)


def _scaling(s: CatalogScaling) -> str:
    text = f"{s.min if s.min is not None else 0} to {s.max if s.max is not None else '-'}"
    if s.idle_timeout:
        text += f", stopped after {render.duration(s.idle_timeout)} idle"
    if s.schedule:
        text += "; " + "; ".join(
            f"{','.join(w.days or []) or 'daily'} {w.from_ or ''}-{w.to or ''}: {w.min or 0} to {w.max or '-'}"
            for w in s.schedule
        )
    if s.prewarm:
        text += f" (prewarm {render.duration(s.prewarm)})"
    return text


def _gpu_need(p: CatalogProfile) -> str:
    if p.gpu_class:
        return f"{p.gpus_per_node or 1}× {p.gpu_class}"
    if p.gpu:
        need = []
        if p.gpu.min_compute_capability:
            need.append(f"cc ≥ {p.gpu.min_compute_capability:g}")
        if p.gpu.min_memory_gb:
            need.append(f"≥ {p.gpu.min_memory_gb} GiB")
        return f"{p.gpus_per_node or 1}× GPU ({', '.join(need)})" if need else f"{p.gpus_per_node or 1}× GPU"
    return "cpu"


def read_document(file: Path, flag: str) -> Any:
    """A YAML or JSON file's content (JSON is YAML); an unreadable or malformed file is a usage error naming it."""
    try:
        text = file.read_text()
    except OSError as error:
        raise typer.BadParameter(f"{file}: {error.strerror or error}", param_hint=flag) from None
    try:
        return json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise typer.BadParameter(
            f"{file} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: {error}", param_hint=flag
        ) from None


def read_mapping(file: Path | None, what: str) -> dict[str, Any]:
    """``--file``'s document, which must be one ``what`` (a mapping); empty without a file."""
    if file is None:
        return {}
    loaded = read_document(file, "--file")
    if not isinstance(loaded, dict):
        raise typer.BadParameter(
            f"{file} holds {type(loaded).__name__}; it must be one {what} (a mapping)", param_hint="--file"
        )
    return loaded


def checked(model: type[Any], document: Any, where: str) -> Any:
    """The document as the spec's type, or exit naming each field that is wrong (before anything is sent)."""
    try:
        return model.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'the document'}: {e['msg']}" for e in error.errors()
        )
        raise fail(f"{where} is not a {model.model_config.get('title') or model.__name__}: {problems}") from None


@models.command("add")
def add(
    name: str = typer.Argument("", metavar="[MODEL]", help="The model's name [default: the file's name field]."),
    file: Path | None = typer.Option(
        None, "--file", "-f", metavar="PATH", help="A catalog.Model as YAML or JSON.", dir_okay=False
    ),
    source: str | None = typer.Option(
        None, "--source", metavar="SOURCE", help="Where the weights come from (a repo, a URL, a path)."
    ),
    alias: list[str] = typer.Option(
        [], "--alias", metavar="NAME", help="Another name clients may ask for (repeat for more)."
    ),
    description: str | None = typer.Option(None, "--description", metavar="TEXT"),
    engine: str | None = typer.Option(
        None, "--engine", metavar="ENGINE", help="The profile's engine (vllm, sglang, llamacpp, ollama, sim)."
    ),
    gpu_class: str | None = typer.Option(
        None, "--gpu-class", metavar="CLASS", help="The profile's GPU class [default: CPU]."
    ),
    tp: int | None = typer.Option(None, "--tp", metavar="N", help="Tensor parallel degree of the profile."),
    min_replicas: int | None = typer.Option(None, "--min", metavar="N", help="Fewest replicas kept (0 = on demand)."),
    max_replicas: int | None = typer.Option(None, "--max", metavar="N", help="Most replicas."),
    class_: str | None = typer.Option(None, "--class", metavar="CLASS", help="critical, standard or opportunistic."),
    owner: str | None = typer.Option(
        None, "--owner", metavar="SCOPE", help="org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT [default: shared]."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Add a model to the cluster's catalog, from a catalog.Model file or from flags; the reconciler places it."""
    document = read_mapping(file, "catalog.Model")
    flags: dict[str, Any] = {
        "source": source,
        "aliases": alias or None,
        "description": description,
        "class": class_,
        "owner": owner,
    }
    document.update({k: v for k, v in flags.items() if v is not None})
    if name:
        if document.get("name") not in (None, name):
            raise typer.BadParameter(
                f"the file names the model {document['name']!r}, the command {name!r}; drop one", param_hint="MODEL"
            )
        document["name"] = name
    if not document.get("name"):
        raise typer.BadParameter(
            "say the model's name: opod ctl models add NAME, or a name field in --file", param_hint="MODEL"
        )
    profile = {k: v for k, v in {"engine": engine, "gpu_class": gpu_class, "tp": tp}.items() if v is not None}
    if profile:
        document["profiles"] = [*document.get("profiles", []), profile]
    if min_replicas is not None or max_replicas is not None:
        scaling = dict(document.get("scaling") or {})
        scaling.update({k: v for k, v in {"min": min_replicas, "max": max_replicas}.items() if v is not None})
        document["scaling"] = scaling
    entry = checked(CatalogModel, document, str(file) if file else "the model")
    body = request("POST", path("models"), wire(entry))
    if as_json:
        return emit_json(body)
    added = parse(ModelAdded, body, "POST /api/v1/models")
    render.line(f"added {added.added or entry.name}; opod ctl models ls shows its replicas as they start")


@models.command("rm")
def remove(name: str = NAME, as_json: bool = render.json_option()) -> None:
    """Remove a model from the catalog; its replicas stop. A model the settings declare is refused."""
    body = request("DELETE", path("models", name))
    if as_json:
        return emit_json(body)
    view = parse(Removed, body, "DELETE /api/v1/models/{name}")
    render.line(f"removed {view.removed or name}")


@models.command("scale")
def scale(
    name: str = NAME,
    min_replicas: int | None = typer.Option(
        None, "--min", metavar="N", help="Fewest replicas kept (0 = started on demand)."
    ),
    max_replicas: int | None = typer.Option(None, "--max", metavar="N", help="Most replicas."),
    idle_timeout: str | None = typer.Option(
        None, "--idle-timeout", metavar="DURATION", help="Stop an on-demand model idle this long (10m)."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Set a model's replica bounds and idle timeout; the answer is what is in force now."""
    idle = render.parse_duration(idle_timeout, "--idle-timeout") if idle_timeout is not None else None
    body = request(
        "POST", path("models", name, "scale"), wire(ScaleRequest(min=min_replicas, max=max_replicas, idle_timeout=idle))
    )
    if as_json:
        return emit_json(body)
    view = parse(ScaleResponse, body, "POST /api/v1/models/{name}/scale")
    line = f"{view.model or name}: {view.min or 0} to {view.max if view.max is not None else '-'} replicas"
    if view.on_demand:
        line += f", on demand (stopped after {render.duration(view.idle_timeout)} idle)"
    render.line(line)


@models.command("resources")
def resources(
    name: str = NAME,
    profile: str | None = typer.Option(
        None, "--profile", metavar="PROFILE", help="Which profile [default: the model's only one]."
    ),
    memory_gb: int | None = typer.Option(None, "--memory-gb", metavar="N", help="Host memory a replica needs, GiB."),
    cpu_cores: int | None = typer.Option(None, "--cpu-cores", metavar="N", help="CPU cores a replica needs."),
    as_json: bool = render.json_option(),
) -> None:
    """Set the host memory and CPU cores a profile's replicas reserve."""
    body = request(
        "POST",
        path("models", name, "resources"),
        wire(ResourcesRequest(profile=profile, memory_gb=memory_gb, cpu_cores=cpu_cores)),
    )
    if as_json:
        return emit_json(body)
    model = parse(CatalogModel, body, "POST /api/v1/models/{name}/resources")
    for p in model.profiles or []:
        if profile in (None, p.name):
            render.line(
                f"{model.name or name} profile {p.name or '(unnamed)'}: "
                f"{p.min_memory_gb or 0} GiB host memory, {p.cpu_cores or 0} CPU cores"
            )


@models.command("class")
def set_class(
    name: str = NAME,
    class_: str = typer.Argument(
        ..., metavar="CLASS", help="critical (preempts), standard, or opportunistic (preemptible)."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Set a model's capacity class; a critical model may preempt an opportunistic one."""
    body = request("POST", path("models", name, "class"), wire(ClassRequest(class_=class_)))
    if as_json:
        return emit_json(body)
    view = parse(ClassView, body, "POST /api/v1/models/{name}/class")
    render.line(f"{view.model or name}: class {view.class_ or class_}")


@models.command("owner")
def set_owner(
    name: str = NAME,
    owner: str = typer.Argument(
        "", metavar="[SCOPE]", help="org:NAME, team:ORG/TEAM or project:ORG/TEAM/PROJECT [default: shared]."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Give a model to an org, team or project (only they see it), or share it with everyone."""
    body = request("POST", path("models", name, "owner"), wire(OwnerRequest(owner=owner)))
    if as_json:
        return emit_json(body)
    view = parse(OwnerView, body, "POST /api/v1/models/{name}/owner")
    render.line(f"{view.model or name}: owned by {view.owner}" if view.owner else f"{view.model or name}: shared")


@models.command("fallbacks")
def set_fallbacks(
    name: str = NAME,
    fallbacks: list[str] = typer.Argument(
        None, metavar="[MODEL]...", help="Models tried in order when it cannot serve; none takes them all away."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Replace the models a model falls back to when every slot is taken or no worker can serve it."""
    body = request("PUT", path("models", name, "fallbacks"), wire(FallbacksRequest(fallbacks=fallbacks or [])))
    if as_json:
        return emit_json(body)
    view = parse(FallbacksView, body, "PUT /api/v1/models/{name}/fallbacks")
    chain = ", then ".join(view.fallbacks or [])
    render.line(f"{view.model or name}: falls back to {chain}" if chain else f"{view.model or name}: no fallbacks")


@models.command("retry")
def retry(name: str = NAME, as_json: bool = render.json_option()) -> None:
    """Start a model parked after repeated start failures again."""
    body = request("POST", path("models", name, "retry"))
    if as_json:
        return emit_json(body)
    view = parse(RetryView, body, "POST /api/v1/models/{name}/retry")
    render.line(f"{name}: parked, now tried again" if view.was_parked else f"{name} was not parked; nothing to retry")


@models.command("target")
def target(
    name: str = NAME,
    tokens_per_sec: float = typer.Option(
        ..., "--tokens-per-sec", metavar="NUMBER", help="The throughput wanted, tokens/s."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """How many replicas a throughput needs (from measured capacity), and whether the fleet has room for them."""
    body = request("GET", path("models", name, "target"), query={"tokens_per_sec": tokens_per_sec})
    if as_json:
        return emit_json(body)
    v = parse(TargetView, body, "GET /api/v1/models/{name}/target")
    render.show(
        render.pairs(
            [
                ("model", v.model or name),
                ("profile", v.profile),
                ("wanted", f"{v.tok_per_sec or tokens_per_sec:g} tokens/s"),
                (
                    "per replica",
                    f"{v.per_replica_tok_per_sec:g} tokens/s" if v.per_replica_tok_per_sec is not None else None,
                ),
                ("replicas needed", v.needed),
                ("now", v.current),
                ("more", v.more),
                ("room for", v.room),
                ("fits", v.fits),
                ("blocked on", v.blocked),
                ("would preempt", v.preempts),
            ]
        )
    )


@models.command("headroom")
def headroom(
    name: str = NAME,
    limit: int | None = typer.Option(
        None, "--limit", metavar="N", help="Most more replicas to try [default: 16, at most 64]."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """How many more replicas of a model the fleet could place now, and where."""
    body = request("GET", path("models", name, "headroom"), query={"limit": limit})
    if as_json:
        return emit_json(body)
    v = parse(HeadroomView, body, "GET /api/v1/models/{name}/headroom")
    render.show(
        render.pairs(
            [
                ("model", v.model or name),
                ("replicas now", v.current),
                ("room for more", v.more),
                ("stopped at the limit", v.limited),
                ("tokens/s", v.tok_per_sec),
                ("more by preempting", v.by_preempting),
                ("would preempt", v.preempts),
                ("blocked on", v.blocked),
            ]
        )
    )
    if v.nodes:
        places = render.table("MORE", "NODES")
        for i, group in enumerate(v.nodes, 1):
            places.add_row(str(i), ", ".join(group))
        render.show(places)


@capacity.command("ls")
def list_capacity(as_json: bool = render.json_option()) -> None:
    """Every recorded capacity measurement: concurrency at the SLO, throughput, latencies, who measured it."""
    body = request("GET", path("capacity"))
    if as_json:
        return emit_json(body)
    rows = parse_list(CapacityView, body, "GET /api/v1/capacity")
    shown = render.table("MODEL", "PROFILE", "CONCURRENCY", "TOKENS/S", "TTFT P99", "TPOT P99", "MEASURED", "BY")
    for c in rows:
        shown.add_row(
            c.model or render.DASH,
            c.profile or render.DASH,
            render.text(c.max_concurrency_at_slo),
            render.text(c.throughput_tok_per_sec),
            render.duration(c.ttft_p99),
            render.duration(c.tpot_p99),
            c.measured_at.isoformat(timespec="seconds") if c.measured_at else render.DASH,
            c.measured_by or render.DASH,
        )
    render.show(shown)
    if not rows:
        render.note("no measurements yet: opod ctl models capacity put MODEL --file CAPACITY.yaml records one")


@capacity.command("put")
def put_capacity(
    name: str = NAME,
    file: Path | None = typer.Option(
        None, "--file", "-f", metavar="PATH", help="A bench.Capacity as YAML or JSON.", dir_okay=False
    ),
    profile: str | None = typer.Option(None, "--profile", metavar="PROFILE", help="The profile measured."),
    concurrency: int | None = typer.Option(
        None, "--max-concurrency", metavar="N", help="Most concurrent requests within the SLO (0 is a result)."
    ),
    throughput: float | None = typer.Option(None, "--throughput", metavar="NUMBER", help="Tokens/s one replica gave."),
    ttft_p99: str | None = typer.Option(
        None, "--ttft-p99", metavar="DURATION", help="Time to first token, p99 (350ms)."
    ),
    tpot_p99: str | None = typer.Option(
        None, "--tpot-p99", metavar="DURATION", help="Time per output token, p99 (40ms)."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Record a capacity measurement of a model's profile; target and headroom count replicas from it."""
    document = read_mapping(file, "bench.Capacity")
    flags = {
        "profile": profile,
        "max_concurrency_at_slo": concurrency,
        "throughput_tok_per_sec": throughput,
        "ttft_p99": render.parse_duration(ttft_p99, "--ttft-p99") if ttft_p99 is not None else None,
        "tpot_p99": render.parse_duration(tpot_p99, "--tpot-p99") if tpot_p99 is not None else None,
    }
    document.update({k: v for k, v in flags.items() if v is not None})
    document.setdefault("model", name)
    measurement = checked(BenchCapacity, document, str(file) if file else "the measurement")
    body = request("PUT", path("models", name, "capacity"), wire(measurement))
    if as_json:
        return emit_json(body)
    c = parse(BenchCapacity, body, "PUT /api/v1/models/{name}/capacity")
    render.line(
        f"{c.model or name} profile {c.profile or '(default)'}: {render.text(c.max_concurrency_at_slo)} concurrent within the SLO, "
        f"{render.text(c.throughput_tok_per_sec)} tokens/s"
    )
