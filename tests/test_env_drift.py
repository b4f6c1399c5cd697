"""No module under src/opod reads an OPOD_* variable that is not declared.

Declared means: a row of the contract's table (``opod.contract.env``), a retired
row, or a config override in ``opod.config``. Environment reads themselves live
in ``opod.config`` only, so one table says everything opod reads.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from opod import config
from opod.contract import env as contract_env

SRC = Path(__file__).resolve().parent.parent / "src" / "opod"
NAME = re.compile(r"^OPOD_[A-Z0-9_]+$")
CONTRACT_NAMES = {r.name for r in contract_env.env()} | {r.name for r in contract_env.retired()}
ALLOWED_READER = Path("config.py")


def _declared(name: str) -> bool:
    return name in CONTRACT_NAMES or config.declared(name)


def _env_key(node: ast.AST) -> ast.AST | None:
    """The key expression when ``node`` reads the environment (os.environ[k], .get(k), os.getenv(k))."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
        return node.slice
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        func = node.func
        if func.attr == "getenv" or (
            func.attr in ("get", "pop", "setdefault")
            and isinstance(func.value, ast.Attribute)
            and func.value.attr == "environ"
        ):
            return node.args[0]
    return None


def scan(root: Path) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
                if not _declared(node.value):
                    problems.append(
                        f"{rel}:{node.lineno}: {node.value} is neither in the contract table nor a config override"
                    )
            key = _env_key(node)
            if key is None or rel == ALLOWED_READER:
                continue
            literal = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
            if literal is None or NAME.match(literal) or literal in CONTRACT_NAMES:
                problems.append(f"{rel}:{node.lineno}: reads the environment directly; go through opod.config.read")
    return problems


def test_src_reads_only_declared_variables_and_only_through_config() -> None:
    assert scan(SRC) == []


def test_a_stray_variable_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "opod"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "*.yaml"))
    (copy / "stray.py").write_text('import os\n\nLEVEL = os.environ["OPOD_X"]\nOTHER = os.getenv("OPOD_HOME")\n')
    problems = scan(copy)
    assert "stray.py:3: OPOD_X is neither in the contract table nor a config override" in problems
    assert "stray.py:3: reads the environment directly; go through opod.config.read" in problems
    assert "stray.py:4: reads the environment directly; go through opod.config.read" in problems


def test_config_refuses_to_read_an_undeclared_name() -> None:
    try:
        config.read("OPOD_NOT_A_THING", {})
    except KeyError as err:
        assert "neither a contract variable nor a declared config override" in str(err)
    else:
        raise AssertionError("an undeclared name was read")


def test_config_reads_trimmed_values_flags_and_warns_about_retired_names() -> None:
    environ = {"OPOD_HOME": "  /tmp/o  ", "OPOD_REJECT_BEARER": "TRUE", "OPOD_UI": "0"}
    assert config.read("OPOD_HOME", environ) == "/tmp/o"
    assert config.home(environ) == Path("/tmp/o")
    assert config.flag("OPOD_REJECT_BEARER", environ)
    assert not config.flag("OPOD_SLEEP_MODE", environ)
    warnings = config.retired_warnings(environ)
    assert len(warnings) == 1 and warnings[0].startswith("OPOD_UI is set but was retired in v0.3.0")
