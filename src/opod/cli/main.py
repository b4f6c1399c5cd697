"""The ``opod`` entry point: the root command and its groups."""

from __future__ import annotations

import typer

from opod import __version__
from opod.cli import catalog, join, model, node, sim, token, up

app = typer.Typer(
    name="opod",
    help="A self-hosted LLM inference fleet: one OpenAI-compatible endpoint over your machines.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
app.command("up")(up.command)
app.command("join")(join.command)
app.add_typer(token.app, name="token")
app.add_typer(model.app, name="model")
app.add_typer(node.app, name="node")
app.add_typer(catalog.app, name="catalog")
app.command("sim")(sim.command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"opod {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """opod: one endpoint, your GPUs."""


def run() -> None:
    app()
