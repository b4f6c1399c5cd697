"""The ``opod`` entry point: the root command and its groups."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperArgument, TyperGroup, TyperOption

from opod import __version__
from opod.cli import catalog, join, model, node, sim, token, up
from opod.cli.ctl import app as ctl_app

_METAVARS = {"str": "TEXT", "int": "N", "float": "NUMBER", "Path": "PATH"}


def _name_values(command: Any) -> None:
    """Help that reads as a command line: ``--flag`` with no placeholder, a value named in capitals.

    typer shows a parameter's Python type (``<bool>``, ``<str>``) where no metavar is given,
    and beside every argument; an option's own ``metavar`` (HOST:PORT, PATH, URL) wins. Help
    strings are taken as plain text, so a ``[default: ...]`` in one is shown, not read as markup.
    """
    if getattr(command, "_opod_named", False):
        return
    command._opod_named = True
    ctx = typer.Context(command, info_name=command.name)
    for param in [*command.params, command.get_help_option(ctx)]:
        if isinstance(param, TyperArgument):
            param.__class__ = _Argument
            if param.help:
                param.help = escape(param.help)
        if not isinstance(param, TyperOption):
            continue
        if param.metavar is None:
            shown = param.display_type(ctx).strip("<>")
            param.metavar = "" if param.is_flag else _METAVARS.get(shown, shown.upper())
        if param.help:
            param.help = escape(param.help)
    for sub in getattr(command, "commands", {}).values():
        _name_values(sub)


class _Argument(TyperArgument):
    """An argument whose help shows its name (ID, PATHS...) and no Python type beside it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


class _Root(TyperGroup):
    """The ``opod`` group: its help, and every subcommand's, cleaned once before it runs."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        _name_values(self)
        return super().main(*args, **kwargs)


app = typer.Typer(
    cls=_Root,
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
app.add_typer(ctl_app, name="ctl")
app.command("sim")(sim.command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"opod {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """opod: one endpoint, your GPUs."""


def run() -> None:
    app()
