"""``opod ctl models adapters MODEL --adapter NAME=SOURCE ...``: replace a model's LoRA adapters whole."""

from __future__ import annotations

import typer
from rich.markup import escape

from opod.cli.common import fail
from opod.cli.ctl import render
from opod.cli.ctl.api import emit_json, parse, path, request, wire
from opod.contract.admin.catalog import CatalogAdapter
from opod.contract.admin.models import AdaptersRequest


def parse_adapter(text: str, owner: str) -> CatalogAdapter:
    """``NAME=SOURCE`` as an adapter; ``typer.Exit`` saying the form when it is not one."""
    name, sep, source = text.partition("=")
    if not sep or not name.strip() or not source.strip():
        raise fail(escape(f"--adapter {text!r}: write NAME=SOURCE, as in --adapter support=/data/adapters/support"))
    return CatalogAdapter(name=name.strip(), source=source.strip(), owner=owner or None)


def set_adapters(
    name: str = typer.Argument(..., metavar="MODEL", help="A model's name (opod ctl models ls)."),
    adapter: list[str] = typer.Option(
        None,
        "--adapter",
        metavar="NAME=SOURCE",
        help="An adapter, served as MODEL:NAME, from SOURCE (a PEFT adapter directory on the workers); repeat it. "
        "None takes every adapter away.",
    ),
    owner: str = typer.Option(
        "", "--owner", metavar="SCOPE", help="org:, team:, project:, user: or key: only they see the adapters."
    ),
    as_json: bool = render.json_option(),
) -> None:
    """Replace a model's LoRA adapters: each is read on the workers serving it and checked before any attaches."""
    wanted = [parse_adapter(text, owner) for text in adapter or []]
    body = request("POST", path("models", name, "adapters"), wire(AdaptersRequest(adapters=wanted)))
    if as_json:
        return emit_json(body)
    view = parse(AdaptersRequest, body, "POST /api/v1/models/{name}/adapters")
    if not view.adapters:
        return render.line(f"{name}: no adapters")
    shown = render.table("SERVED AS", "SOURCE", "OWNER", wrap=["SOURCE"])
    for each in view.adapters:
        shown.add_row(f"{name}:{each.name}", each.source or render.DASH, each.owner or "shared")
    render.show(shown)
