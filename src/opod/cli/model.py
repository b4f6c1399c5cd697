"""``opod model``: add, list, load and unload models through the leader's admin API."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from opod.cli.common import call, fail, out

app = typer.Typer(help="Models: add (catalog id, --gguf PATH, or hf:owner/repo), list, load, unload, remove.", no_args_is_help=True)


@app.command("add")
def add(
    model: str = typer.Argument("", metavar="[ID | hf:OWNER/REPO]", help="A catalog id (opod catalog ls), or hf:owner/repo."),
    gguf: Path | None = typer.Option(None, "--gguf", help="A local GGUF file to serve.", dir_okay=False),
    file: str = typer.Option("", "--file", help="With hf:owner/repo, the GGUF file to use [default: chosen for you]."),
    name: str = typer.Option("", "--name", help="The name clients ask for [default: from the id, repo or file]."),
    no_load: bool = typer.Option(False, "--no-load", help="Add without loading it anywhere yet."),
    engine: str = typer.Option("", "--engine", help="Load it only on workers running this engine (sim: a simulated model)."),
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
        body = {"name": name, "source": repo, "file": file}
    elif model:
        body = {"name": name or model, "source": ""}
    else:
        raise fail("say what to add: a catalog id, hf:owner/repo, or --gguf PATH")
    body["load"] = not no_load
    body["engine"] = engine
    added = call("POST", "/api/v1/models", body)
    out.print(f"added {added['added']}" + ("" if no_load else "; loading it on a worker (opod model ls shows progress)"))


@app.command("ls")
def list_models(as_json: bool = typer.Option(False, "--json")) -> None:
    """List added models, where each is wanted and where it is served."""
    rows = call("GET", "/api/v1/models")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("MODEL", "CAPABILITIES", "SOURCE", "STATE"):
        table.add_column(column, no_wrap=column != "STATE")
    for row in rows:
        table.add_row(row["name"], ",".join(row["capabilities"]), row["source"], row["state"])
    out.print(table)
    if not rows:
        out.print("[dim]no models yet: opod model add smollm2-135m-instruct[/]")


def _place(action: str, model: str, node: str) -> None:
    view = call("POST", f"/api/v1/models/{model}/{action}", {"node": node})
    out.print(f"{model}: {action} {'on ' + node if node else 'wanted'}; now {view['state']}")


@app.command("load")
def load(model: str = typer.Argument(..., metavar="ID"), node: str = typer.Option("", help="A node id [default: any worker].")) -> None:
    """Keep a model loaded (on a node, or anywhere)."""
    _place("load", model, node)


@app.command("unload")
def unload(model: str = typer.Argument(..., metavar="ID"), node: str = typer.Option("", help="A node id [default: everywhere].")) -> None:
    """Unload a model (from a node, or everywhere)."""
    _place("unload", model, node)


@app.command("rm")
def remove(model: str = typer.Argument(..., metavar="ID")) -> None:
    """Remove an added model; it is unloaded everywhere."""
    call("DELETE", f"/api/v1/models/{model}")
    out.print(f"removed {model}")
