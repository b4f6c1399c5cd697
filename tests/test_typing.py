"""The type check CI runs stays as strict as the code is written to: every function typed, no bare generics.

``disallow_untyped_defs`` refuses a function without annotations (its callers would get ``Any``);
``disallow_any_generics`` refuses a bare ``dict``, ``list``, ``tuple`` or ``Callable``, which says
nothing of what it holds. Dropping either, or loosening them for a few modules, lets the code drift
back unseen; these tests fail first.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STRICT = ("disallow_untyped_defs", "disallow_any_generics")


def _mypy() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        settings: dict[str, Any] = tomllib.load(f)["tool"]["mypy"]
    return settings


def test_mypy_refuses_untyped_functions_and_bare_generics_in_the_whole_package() -> None:
    mypy = _mypy()
    assert {name: mypy.get(name) for name in STRICT} == dict.fromkeys(STRICT, True)
    assert mypy.get("files") == ["src/opod"]


def test_no_module_is_let_off() -> None:
    loosened = [
        override.get("module")
        for override in _mypy().get("overrides", [])
        if override.get("ignore_errors") or any(override.get(name) is False for name in STRICT)
    ]
    assert loosened == []


def test_ci_runs_the_type_check() -> None:
    steps = (REPO / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/mypy" in steps
