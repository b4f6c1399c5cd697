"""``opod ctl presets …`` and ``opod ctl weights …``: the bundled models the fleet can add, and weights left on disks."""

from __future__ import annotations

import typer
from rich.markup import escape

from opod.cli.common import out
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, parse_list, path, request, wire
from opod.contract.admin.fleet import CollectRequest, CollectResult, OrphanView
from opod.contract.admin.models import ModelAdded, PresetsAutoRequest, PresetsView

presets = typer.Typer(
    help="Presets: the models opod knows how to serve, which fit this fleet, auto-adding them.", no_args_is_help=True
)
weights = typer.Typer(
    help="Weights on the nodes' disks that no model of the catalog uses: list them, delete them.", no_args_is_help=True
)


def _presets_table(view: PresetsView) -> None:
    render.line(f"auto-add: {'on' if view.auto else 'off'} (a preset that fits a node is added by itself when on)")
    shown = render.table(
        "PRESET",
        "MAKES",
        "FITS",
        "GPU CLASSES",
        "IN CATALOG",
        "ADDED BY",
        "LICENCE",
        "NOTE",
        wrap=["NOTE", "GPU CLASSES"],
    )
    for p in view.presets or []:
        notes = [f"blocked: {p.blocked}"] if p.blocked else []
        if p.declined:
            notes.append("declined (removed after auto-add; opod ctl presets add brings it back)")
        licence = (p.licence.id or p.licence.name) if p.licence else None
        shown.add_row(
            p.name or render.DASH,
            p.makes or render.DASH,
            render.text(p.fits),
            render.text(p.fits_classes),
            render.text(p.in_catalog),
            p.added_by or render.DASH,
            licence or render.DASH,
            "\n".join(notes) or render.DASH,
        )
    render.show(shown)
    if view.comfyui:
        render.note(f"ComfyUI: {view.comfyui}")


@presets.command("ls")
def list_presets(as_json: bool = render.json_option()) -> None:
    """Every preset: what it makes, whether it fits a node (and on which GPU classes), whether it is in the catalog."""
    body = request("GET", path("presets"))
    if as_json:
        return emit_json(body)
    _presets_table(parse(PresetsView, body, "GET /api/v1/presets"))


@presets.command("auto")
def auto(
    setting: str = typer.Argument(
        ..., metavar="on|off", help="on: add a preset by itself when a node fits it; off: only by hand."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Turn auto-adding of presets that fit on or off."""
    if setting not in ("on", "off"):
        raise typer.BadParameter(f"{setting!r}: say on or off", param_hint="on|off")
    body = request("PUT", path("presets", "auto"), wire(PresetsAutoRequest(on=setting == "on")))
    if as_json:
        return emit_json(body)
    view = parse(PresetsView, body, "PUT /api/v1/presets/auto")
    fitting = [p.name for p in view.presets or [] if p.fits and not p.in_catalog and p.name]
    render.line(
        f"auto-add: {'on' if view.auto else 'off'}; {render.count(len(fitting), 'preset')} fit this fleet and are not in the catalog"
        + (" (opod ctl presets ls)" if fitting else "")
    )


@presets.command("add")
def add(
    name: str = typer.Argument(..., metavar="PRESET", help="A preset's name (opod ctl presets ls)."),
    as_json: bool = render.json_option(),
) -> None:
    """Add a preset to the cluster's catalog (and clear a decline of it)."""
    body = request("POST", path("presets", name))
    if as_json:
        return emit_json(body)
    added = parse(ModelAdded, body, "POST /api/v1/presets/{name}")
    render.line(f"added {added.added or name}; opod ctl models ls shows its replicas as they start")


@weights.command("orphans")
def orphans(as_json: bool = render.json_option()) -> None:
    """Weights on each node's disk that no model of the catalog uses, and the space they take."""
    body = request("GET", path("weights", "orphans"))
    if as_json:
        return emit_json(body)
    rows = parse_list(OrphanView, body, "GET /api/v1/weights/orphans")
    shown = render.table("NODE", "SIZE", "PATHS", wrap=["PATHS"])
    for o in rows:
        shown.add_row(o.node or render.DASH, render.size(o.bytes), "\n".join(o.paths or []) or render.DASH)
    render.show(shown)
    total = sum(o.bytes or 0 for o in rows)
    render.note(
        f"{render.size(total)} unused on {render.count(len(rows), 'node')}; opod ctl weights collect deletes them"
        if rows
        else "no unused weights"
    )


@weights.command("collect")
def collect(
    node: str | None = typer.Option(
        None, "--node", metavar="NODE", help="Only this node [default: every node with unused weights]."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Delete unused weights, node by node, showing each node's result as it finishes."""
    if node is not None:
        targets = [node]
    else:
        found = parse_list(OrphanView, request("GET", path("weights", "orphans")), "GET /api/v1/weights/orphans")
        targets = [o.node for o in found if o.node]
    results: list[object] = []
    freed, failed = 0, 0
    for i, target in enumerate(targets, 1):
        body = request("POST", path("weights", "collect"), wire(CollectRequest(node=target)))
        rows = parse_list(CollectResult, body, "POST /api/v1/weights/collect")
        results.extend(body)
        for r in rows:
            freed += r.bytes or 0
            failed += bool(r.error)
            if not as_json:
                line = (
                    f"[{i}/{len(targets)}] {r.node or target}: {r.files or 0} files, {render.size(r.bytes or 0)} freed"
                )
                out.print(escape(line) + (f" [red]error:[/] {escape(r.error)}" if r.error else ""))
    if as_json:
        return emit_json(results)
    render.line(
        f"freed {render.size(freed)} on {render.count(len(targets), 'node')}"
        + (f"; {failed} failed (see above)" if failed else "")
        if targets
        else "no unused weights to collect"
    )
    if failed:
        raise typer.Exit(1)
