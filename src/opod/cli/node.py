"""``opod node``: the workers the leader knows, and forgetting one that has gone."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from opod.cli.common import call, out

app = typer.Typer(help="Nodes: list the workers the leader knows (state, machine, models), remove one that has gone.", no_args_is_help=True)


def _disk(row: dict) -> str:
    free, total = row.get("disk_free_gb", 0), row.get("disk_total_gb", 0)
    return f"{free}/{total} GiB" if total else "-"


def _gpus(row: dict) -> str:
    """``1× NVIDIA H200 (139 GiB)``, a line per kind of card; ``-`` for none."""
    kinds: dict[tuple[str, int], int] = {}
    for gpu in row.get("gpus") or []:
        kind = (gpu["name"], gpu["memory_total_mb"] // 1024)
        kinds[kind] = kinds.get(kind, 0) + 1
    return "\n".join(f"{n}× {name} ({gib} GiB)" for (name, gib), n in kinds.items()) or "-"


def _models(row: dict) -> str:
    """A line per model: its name, and why it cannot serve when it cannot (``chat: its engine crashed … and is restarting``)."""
    states = row.get("model_states") or {}
    names = sorted({*row["models"], *states})
    return "\n".join(name if states.get(name, "serving") == "serving" else f"{name}: {states[name]}" for name in names) or "-"


def _seen(row: dict) -> str:
    age = row.get("last_heartbeat_s")
    return "never" if age is None else f"{age:g}s"


@app.command("ls")
def list_nodes(as_json: bool = typer.Option(False, "--json", help="The API's rows as JSON.")) -> None:
    """List the workers: whether each takes work (and why not), its machine, its engine and the models it serves."""
    rows = call("GET", "/api/v1/nodes")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for column in ("NODE", "STATE", "HOST", "CPU", "RAM", "GPU", "DISK FREE", "ENGINE", "MODELS", "SEEN"):
        table.add_column(column, no_wrap=column not in ("STATE", "MODELS"), overflow="fold", min_width=12 if column == "MODELS" else None)
    for row in rows:
        table.add_row(row["id"], row["state"], row["hostname"], str(row["cpu_count"]), f"{row['memory_gb']} GiB", _gpus(row), _disk(row),
                      ",".join(row["engines"]) or "-", _models(row), _seen(row))
    out.print(table)
    if not rows:
        out.print("[dim]no workers yet: opod token create --node, then on another machine opod join URL --token T[/]")


@app.command("rm")
def remove(node: str = typer.Argument(..., metavar="ID")) -> None:
    """Forget a node that has gone; a live node serving models is refused (stop its worker first)."""
    call("DELETE", f"/api/v1/nodes/{node}")
    out.print(f"removed {node}")
