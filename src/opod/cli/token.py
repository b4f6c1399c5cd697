"""``opod token``: API keys for clients and node tokens for workers, through the leader's admin API."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from opod.cli.common import call, err, out, print_whole

app = typer.Typer(help="API keys and node tokens: create, list, revoke.", no_args_is_help=True)


def _path(node: bool) -> str:
    return "/api/v1/node-tokens" if node else "/api/v1/keys"


@app.command("create")
def create(
    node: bool = typer.Option(False, "--node", help="A token a worker joins with (opod join URL --token T)."),
    ttl: str = typer.Option(
        "", "--ttl", metavar="DURATION", help="Lifetime, e.g. 720h, 30d or 1h30m [default: never expires]."
    ),
    name: str = typer.Option("", "--name", metavar="NAME", help="A name to tell it apart in listings."),
    as_json: bool = typer.Option(False, "--json", help="Print the created key (its secret included) as JSON."),
) -> None:
    """Create a key; it is shown once, only its hash is kept."""
    created = call("POST", _path(node), {"name": name, "expires_in": ttl})
    if as_json:
        typer.echo(json.dumps(created, indent=2))
        return
    what = "node token" if node else "API key"
    expires = f", expires {created['expires_at']}" if created.get("expires_at") else ""
    err.print(f"created {what} {created['id']}{expires}. It is shown once; keep it now:")
    typer.echo(created["secret"])
    if node:
        err.print("[dim]on the worker: opod join http://<leader>:8080 --token <the token>[/]")


@app.command("ls")
def list_keys(
    node: bool = typer.Option(False, "--node", help="List node tokens instead of API keys."),
    as_json: bool = typer.Option(False, "--json", help="Print the keys as a JSON array."),
) -> None:
    """List keys (never the keys themselves)."""
    rows = call("GET", _path(node))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    # A key's last use is recorded when it authenticates a request; node tokens sign calls instead.
    for column in ("ID", "NAME", "PREFIX", "STATE", "CREATED", "EXPIRES") + (("NODE",) if node else ("LAST USED",)):
        table.add_column(column, no_wrap=True)
    for row in rows:
        cells = [
            row["id"],
            row["name"],
            row["prefix"] + "…",
            row["state"],
            row["created_at"][:19].replace("T", " "),
            (row.get("expires_at") or "never")[:19].replace("T", " "),
        ]
        cells.append(row.get("node_id") or "" if node else (row.get("last_used_at") or "never")[:19].replace("T", " "))
        table.add_row(*cells)
    print_whole(table)
    if not rows:
        out.print("[dim]none yet: opod token create" + (" --node" if node else "") + "[/]")


@app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., metavar="ID", help="The id shown by opod token ls."),
    node: bool = typer.Option(False, "--node", help="Revoke a node token (its workers are refused at once)."),
) -> None:
    """Revoke a key or node token; it is refused from the next request on."""
    call("DELETE", f"{_path(node)}/{key_id}")
    out.print(f"revoked {key_id}")
