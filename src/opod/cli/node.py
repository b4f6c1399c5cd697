"""``opod node``: the workers the leader knows, their state, labels and logs, and forgetting one that has gone."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from opod.cli.common import call, fail, out, print_whole

app = typer.Typer(
    help="Nodes: list the workers (state, machine, GPUs, models), cordon or drain one, label it, read its logs, "
    "remove one that has gone.",
    no_args_is_help=True,
)


def _disk(row: dict[str, Any]) -> str:
    free, total = row.get("disk_free_gb", 0), row.get("disk_total_gb", 0)
    return f"{free}/{total} GiB" if total else "-"


def _gpus(row: dict[str, Any]) -> str:
    """A line per class: ``8× H100-80GB (80 GiB, 6 free)``, unhealthy ones counted; ``-`` for none."""
    memory: dict[str, int] = {}
    for gpu in row.get("gpus") or []:
        memory.setdefault(gpu["class"], gpu.get("memory_total_mb", 0) // 1024)
    lines = []
    for group in row.get("gpus_by_class") or []:
        klass = group["class"]
        sick = f", {group['unhealthy']} unhealthy" if group.get("unhealthy") else ""
        lines.append(
            f"{group.get('total', 0)}× {klass} ({memory.get(klass, 0)} GiB, {group.get('free', 0)} free{sick})"
        )
    return "\n".join(lines) or "-"


def _models(states: dict[str, str]) -> str:
    """A line per model: its name, and why it cannot serve when it cannot (``chat: its engine crashed … and is restarting``)."""
    return (
        "\n".join(name if state == "serving" else f"{name}: {state}" for name, state in sorted(states.items())) or "-"
    )


def _state(row: dict[str, Any]) -> str:
    problems = [w for w in row.get("warnings") or [] if w.startswith("takes no requests")]
    return "\n".join([row.get("state", "?"), *problems])


@app.command("ls")
def list_nodes(as_json: bool = typer.Option(False, "--json", help="The API's rows (NodeView) as JSON.")) -> None:
    """List the workers: their state, machine, GPUs by class (free ones too), engine and the models they serve."""
    rows = call("GET", "/api/v1/nodes")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    models = call("GET", "/api/v1/opod/node-models")
    table = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for column in ("NODE", "STATE", "HOST", "CPU", "RAM", "GPU", "DISK FREE", "ENGINE", "MODELS", "SEEN"):
        table.add_column(
            column,
            no_wrap=column not in ("STATE", "MODELS"),
            overflow="fold",
            min_width=12 if column == "MODELS" else None,
        )
    for row in rows:
        table.add_row(
            row["id"],
            _state(row),
            row.get("hostname", ""),
            str(row.get("cpu_count", 0)),
            f"{row.get('memory_gb', 0)} GiB",
            _gpus(row),
            _disk(row),
            ",".join(row.get("engines") or []) or "-",
            _models(models.get(row["id"], {})),
            row.get("last_seen_ago", "never"),
        )
    print_whole(table)
    if not rows:
        out.print("[dim]no workers yet: opod token create --node, then on another machine opod join URL --token T[/]")


@app.command("rm")
def remove(node: str = typer.Argument(..., metavar="ID")) -> None:
    """Forget a node that has gone: a lost one, or an unreachable one with nothing on it."""
    call("DELETE", f"/api/v1/nodes/{node}")
    out.print(f"removed {node}")


@app.command("state")
def set_state(
    node: str = typer.Argument(..., metavar="ID"),
    state: str = typer.Argument(
        ...,
        metavar="STATE",
        help="ready (uncordon), cordon (no new replicas) or drain "
        "(no new replicas or requests; its replicas move elsewhere).",
    ),
) -> None:
    """Cordon, drain or ready a node."""
    answer = call("POST", f"/api/v1/nodes/{node}/state", {"state": state})
    out.print(f"{answer['id']}: {answer['state']}")


@app.command("label")
def label(
    node: str = typer.Argument(..., metavar="ID"),
    changes: list[str] = typer.Argument(
        ..., metavar="KEY=VALUE|KEY-", help="Set KEY=VALUE, or remove an operator label with KEY-."
    ),
) -> None:
    """Set or remove operator labels on a node (over its worker's own); llmgw.io/site, room, row, rack, pdu say where it is."""
    setting: dict[str, str] = {}
    removing: list[str] = []
    for change in changes:
        if "=" in change:
            key, _, value = change.partition("=")
            setting[key] = value
        elif change.endswith("-"):
            removing.append(change[:-1])
        else:
            raise fail(f"{change!r}: write KEY=VALUE to set a label or KEY- to remove one")
    answer = call("POST", f"/api/v1/nodes/{node}/labels", {"set": setting, "remove": removing})
    for key, value in sorted((answer.get("labels") or {}).items()):
        mark = "" if key in (answer.get("operator_labels") or {}) else "  (the worker's)"
        out.print(f"{key}={value}{mark}")


@app.command("logs")
def logs(
    node: str = typer.Argument(..., metavar="ID"),
    source: str = typer.Option("", "--source", help="agent (the default) or a model the node runs an engine for."),
    lines: int = typer.Option(300, "--lines", "-n", min=1, max=2000),
) -> None:
    """The last lines of a node's agent log, or of one engine's."""
    query = f"?lines={lines}" + (f"&source={source}" if source else "")
    answer = call("GET", f"/api/v1/nodes/{node}/logs{query}")
    if answer.get("error"):
        raise fail(answer["error"])
    for line in answer.get("lines") or []:
        typer.echo(line)
