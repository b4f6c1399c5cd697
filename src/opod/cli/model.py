"""``opod model``: the cluster's catalog through the leader's management API (``/api/v1/models``).

``add`` sends a ``catalog.Model``: a catalog id, a local GGUF, or a Hugging Face repo
as its source; ``ls`` and ``show`` read it back; ``load`` and ``unload`` pin a model
to a node or take it off (opod's own routes); ``rm`` removes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from opod.cli.common import call, fail, out, print_whole

app = typer.Typer(
    help="Models: add (catalog id, --gguf PATH, or hf:owner/repo), list, show, load, unload, remove.",
    no_args_is_help=True,
)


@app.command("add")
def add(
    model: str = typer.Argument(
        "", metavar="[ID | hf:OWNER/REPO]", help="A catalog id (opod catalog ls), or hf:owner/repo."
    ),
    gguf: Path | None = typer.Option(None, "--gguf", help="A local GGUF file to serve.", dir_okay=False),
    file: str = typer.Option("", "--file", help="With hf:owner/repo, the GGUF file to use [default: chosen for you]."),
    name: str = typer.Option("", "--name", help="The name clients ask for [default: from the id, repo or file]."),
    alias: list[str] = typer.Option([], "--alias", help="Another name clients may ask for (repeatable)."),
    description: str = typer.Option(
        "", "--description", help="What the model is for, in a line (clients see it in /v1/models)."
    ),
    no_load: bool = typer.Option(False, "--no-load", help="Add without loading it anywhere yet (scaling.min 0)."),
    engine: str = typer.Option(
        "", "--engine", help="Load it only on workers running this engine (sim: a simulated model)."
    ),
) -> None:
    """Add a model; unless --no-load, it is loaded on a worker and kept loaded across restarts."""
    if gguf is not None and model:
        raise fail("give either an ID/hf:OWNER/REPO or --gguf PATH, not both")
    body: dict[str, object]
    if gguf is not None:
        if not gguf.is_file():
            raise fail(f"--gguf {gguf}: no such file")
        body = {"name": name, "source": str(gguf.resolve())}
    elif model.startswith("hf:"):
        repo = model[3:]
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise fail(f"{model!r}: write a Hugging Face repo as hf:owner/repo")
        body = {"name": name, "source": f"{repo}/{file}" if file else repo}
    elif model:
        body = {"name": name or model}
    else:
        raise fail("say what to add: a catalog id, hf:owner/repo, or --gguf PATH")
    if alias:
        body["aliases"] = alias
    if description:
        body["description"] = description
    if engine:
        body["profiles"] = [{"engine": engine}]
    if no_load:
        body["scaling"] = {"min": 0}
    added = call("POST", "/api/v1/models", {k: v for k, v in body.items() if v != ""})
    out.print(
        f"added {added['added']}" + ("" if no_load else "; loading it on a worker (opod model ls shows progress)")
    )


@app.command("ls")
def list_models(as_json: bool = typer.Option(False, "--json", help="Print the spec's ModelView rows.")) -> None:
    """List the catalog's models: replicas ready of those wanted, class, source, and where each is served."""
    rows = call("GET", "/api/v1/models")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    states = call("GET", "/api/v1/model-states")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("MODEL", "REPLICAS", "CLASS", "SOURCE", "STATE"):
        table.add_column(column, no_wrap=column != "STATE")
    for row in rows:
        name = row["name"] + (f" ({', '.join(row['aliases'])})" if row.get("aliases") else "")
        replicas = f"{row.get('ready_replicas', 0)}/{row.get('desired_replicas', 0)}"
        state = states.get(row["name"], "") + (" [parked]" if row.get("parked") else "")
        table.add_row(name, replicas, row.get("class", ""), row.get("source", row.get("external", "")), state)
    print_whole(table)
    if not rows:
        out.print("[dim]no models yet: opod model add smollm2-135m-instruct[/]")


@app.command("show")
def show(model: str = typer.Argument(..., metavar="NAME"), as_json: bool = typer.Option(False, "--json")) -> None:
    """Show a model's definition with the defaults in force (catalog.Model)."""
    definition = call("GET", f"/api/v1/models/{model}")
    if as_json:
        typer.echo(json.dumps(definition, indent=2))
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, value in definition.items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value))
    print_whole(table)


def _place(action: str, model: str, node: str) -> str:
    """The change asked of the leader; its state in words as the leader answered, before the change took effect."""
    view = call("POST", f"/api/v1/models/{model}/{action}", {"node": node})
    return str(view.get("state") or "")


@app.command("load")
def load(
    model: str = typer.Argument(..., metavar="ID"),
    node: str = typer.Option("", help="A node id [default: any worker]."),
) -> None:
    """Load a model now and keep it loaded, across restarts (on a node, or on any worker)."""
    state = _place("load", model, node)
    where = f"on {node}" if node else "on a worker"
    if state.startswith("serving on") and (not node or node in state):
        out.print(f"{model}: {state}; kept loaded {where} from now on", markup=False)
        return
    out.print(f"{model}: loading it {where} now, and keeping it loaded (opod model ls shows progress)", markup=False)


@app.command("unload")
def unload(
    model: str = typer.Argument(..., metavar="ID"),
    node: str = typer.Option("", help="A node id [default: everywhere]."),
) -> None:
    """Unload a model now, from a node (and keep it off it) or from everywhere (until opod model load)."""
    _place("unload", model, node)
    if node:
        out.print(f"{model}: unloading it from {node} now, and keeping it off {node}", markup=False)
    else:
        out.print(f"{model}: unloading it everywhere now; it stays unloaded until opod model load", markup=False)


@app.command("rm")
def remove(model: str = typer.Argument(..., metavar="ID")) -> None:
    """Remove a model from the catalog; it is unloaded everywhere."""
    call("DELETE", f"/api/v1/models/{model}")
    out.print(f"removed {model}")
