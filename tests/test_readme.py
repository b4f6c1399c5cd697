"""The README's commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command_step_by_step() -> None:
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"```sh\n(.+?)\n```", readme)
    assert len(commands) >= 2, "the README must show an install-and-run and an install-and-test command"
    steps = [step.strip() for step in next(c for c in commands if "pytest" in c).split("&&")]
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    # Each step is a line of its own in CI, in the README's order, so each one's failure stops CI.
    found = [ci_lines.index(step) if step in ci_lines else -1 for step in steps]
    assert -1 not in found and found == sorted(found), f"CI must run {steps} as lines of .ci/run, in this order"


def test_ci_checks_lint_format_and_types_before_the_tests() -> None:
    readme = (REPO / "README.md").read_text()
    test_command = next(c for c in re.findall(r"```sh\n(.+?)\n```", readme) if "pytest" in c)
    assert "ruff check src tests bench" in test_command and ".venv/bin/mypy" in test_command
    assert "ruff format --check src tests bench" in test_command


def test_every_cli_command_in_the_readme_table_exists() -> None:
    from typer.main import get_command

    from opod.cli.main import app

    root = get_command(app)
    readme = (REPO / "README.md").read_text()
    for words in re.findall(r"^\| `opod ([a-z]+) ([a-z]+)", readme, flags=re.M):
        group = root.commands[words[0]]
        assert words[1] in group.commands, f"README mentions opod {' '.join(words)}, which does not exist"
