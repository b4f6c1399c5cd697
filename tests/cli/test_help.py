"""``opod … --help`` reads as a command line: no Python type placeholders, no text lost to markup."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from opod.cli.main import app


def _paths(command: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        paths += _paths(sub, (*prefix, name))
    return paths


COMMANDS = _paths(typer.main.get_command(app))


def _help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_is_walked() -> None:
    assert {("up",), ("join",), ("sim",), ("token", "create"), ("catalog", "ls"), ("model",)} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "opod")
def test_help_shows_no_type_placeholders(path: tuple[str, ...]) -> None:
    text = _help(path)
    placeholders = re.findall(r"<(?:bool|str|int|float|Path|list\[[^\]]*\])>", text)
    assert not placeholders, f"opod {' '.join(path)} --help shows {placeholders}:\n{text}"


def test_up_help_names_the_values_and_keeps_its_defaults() -> None:
    text = _help(("up",))
    assert re.search(r"--listen\s+HOST:PORT", text), text
    assert re.search(r"--no-worker\s+Run the leader only", text), "a flag takes no value"
    assert "[default: 0.0.0.0:8080, or OPOD_LISTEN]" in text, (
        "a bracketed default in the help is shown, not eaten as markup"
    )
    assert "[or OPOD_DOOR_ROUTES]" in text


def test_token_create_help_names_the_lifetime() -> None:
    text = _help(("token", "create"))
    assert re.search(r"--ttl\s+DURATION", text) and "[default: never expires]" in text, text
