"""The README's benchmark figures are the committed results table they name, copied whole, so the two cannot drift."""

from __future__ import annotations

import re

from tests.bench.smoke import REPO


def _table(text: str, first: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_the_readmes_compare_figures_are_the_committed_table_it_names() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Benchmarks\n")[1].split("\n## ")[0]
    named = re.search(r"`(bench/results/compare[\w-]*\.md)`", section)
    assert named, "the README's benchmark section names no committed compare table"
    committed = (REPO / named.group(1)).read_text()
    assert _table(section, "measure") == _table(committed, "measure")
    command = re.search(r"^`(python -m bench compare[^`]*)`", committed, re.M)
    assert command and command.group(1) in section  # the command that made the figures, as run
