"""The README's commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"```sh\n(.+?)\n```", readme)
    assert len(commands) >= 2, "the README must show an install-and-run and an install-and-test command"
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_every_cli_command_in_the_readme_table_exists() -> None:
    from typer.main import get_command

    from opod.cli.main import app

    root = get_command(app)
    readme = (REPO / "README.md").read_text()
    for words in re.findall(r"^\| `opod ([a-z]+) ([a-z]+)", readme, flags=re.M):
        group = root.commands[words[0]]
        assert words[1] in group.commands, f"README mentions opod {' '.join(words)}, which does not exist"
