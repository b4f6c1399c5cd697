"""The layers hold: no package imports one above it, and no two files import each other.

Every ``import`` statement under ``src/opod`` counts, wherever it stands: at load time, inside a
function, or under ``TYPE_CHECKING`` (a type-only import still ties two files together, and a
function-level one only hides the tie until it runs). ``docs/architecture.md`` lists the same layers
in the same order, and a test below keeps the two equal.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "opod"
DOC = REPO / "docs" / "architecture.md"

# Top to bottom: a package imports only packages below it (and itself).
LAYERS: tuple[str, ...] = (
    "cli",
    "leader",
    "door",
    "control",
    "gateway",
    "worker",
    "shards",
    "ledger",
    "snapshots",
    "access",
    "settings",
    "fleet",
    "engines",
    "weights",
    "catalog",
    "store",
    "security",
    "http",
    "sim",
    "config",
    "contract",
)

# Packages that may import only these, whatever lies below them.
ONLY: dict[str, frozenset[str]] = {
    "http": frozenset({"contract", "config"}),
    "sim": frozenset({"contract", "http"}),
    "config": frozenset({"contract"}),
    "contract": frozenset(),
}

# Edges refused even where the order would allow them, with the reason printed beside them.
NEVER: dict[tuple[str, str], str] = {
    ("gateway", "control"): "the /v1 path and /api/v1 share the fleet state, access and the store, never each other",
}

# Modules at the top of src/opod whose name is not their layer (config.py is the config layer).
ROOT_MODULES: dict[str, str] = {
    "__main__": "cli",  # `python -m opod` is the command line
}


@dataclass
class Edge:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (a module of the tree, or the nearest package above the name)
    file: str  # the importing file, relative to the tree's parent
    line: int


@dataclass
class Findings:
    forbidden: list[str] = field(default_factory=list)
    cycles: list[str] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)


def module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(root, path): path for path in sorted(root.rglob("*.py"))}


def _absolute(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _resolve(name: str, known: dict[str, Path]) -> str:
    """The tree's module that ``name`` loads: itself, or the nearest package holding it."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def imports(root: Path, known: dict[str, Path]) -> Iterator[Edge]:
    for source, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        file = str(path.relative_to(root.parent))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, source, is_package)
                # `from pkg import mod` loads pkg.mod when it is a module, else a name of pkg.
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            targets = {_resolve(name, known) for name in names if name == root.name or name.startswith(root.name + ".")}
            for target in sorted(targets - {"", source}):
                yield Edge(source, target, file, node.lineno)


def package_of(module: str, root: str = "opod") -> str | None:
    """The layer a module belongs to; None for the root package itself (opod/__init__.py)."""
    if module == root:
        return None
    top = module.split(".")[1]
    return ROOT_MODULES.get(top, top)


def refusal(source_pkg: str | None, target_pkg: str | None) -> str | None:
    """Why ``source_pkg`` may not import ``target_pkg``; None when it may."""
    if target_pkg is None or source_pkg == target_pkg:
        return None  # the root package and one's own package are always reachable
    if source_pkg is None:
        return "opod/__init__.py runs before every module of opod, so it imports none of them"
    if (source_pkg, target_pkg) in NEVER:
        return f"{source_pkg} never imports {target_pkg}: {NEVER[source_pkg, target_pkg]}"
    if source_pkg in ONLY:
        allowed = ONLY[source_pkg]
        if target_pkg in allowed:
            return None
        said = " and ".join(sorted(allowed)) or "nothing else of opod"
        return f"{source_pkg} imports only {said}"
    if source_pkg not in LAYERS or target_pkg not in LAYERS:
        return None  # reported as unplaced instead
    if LAYERS.index(target_pkg) < LAYERS.index(source_pkg):
        return f"{target_pkg} is above {source_pkg} in the layers"
    return None


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def scan(root: Path) -> Findings:
    known = modules(root)
    edges = list(imports(root, known))
    findings = Findings()
    packages = {package_of(name, root.name) for name in known} - {None}
    findings.unplaced = sorted(
        f"{root.name}/{pkg}: a package with no place in the layers" for pkg in packages if pkg not in LAYERS
    )
    for edge in edges:
        why = refusal(package_of(edge.source, root.name), package_of(edge.target, root.name))
        if why:
            findings.forbidden.append(f"{edge.file}:{edge.line}: {edge.source} imports {edge.target}; {why}")
    for component in cycles(edges):
        members = set(component)
        ties = [
            f"{e.file}:{e.line} ({e.source} -> {e.target})"
            for e in edges
            if e.source in members and e.target in members
        ]
        findings.cycles.append(f"import cycle between {', '.join(component)}: " + "; ".join(ties))
    return findings


ROUTE_FUNCTIONS = ("router", "routes")
"""A module of ``control`` that defines one of these at its top level is a route module (an area's handlers)."""
ASSEMBLERS = ("opod.control.areas", "opod.control.app")
"""The modules that put the areas together: the only importers of route modules."""


def route_modules(root: Path, known: dict[str, Path]) -> set[str]:
    out = set()
    for name, path in known.items():
        if not name.startswith(f"{root.name}.control."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name in ROUTE_FUNCTIONS for n in tree.body):
            out.add(name)
    return out


def route_module_imports(root: Path) -> list[str]:
    """Imports of an area's route module by anything but the assemblers: the leader and other areas call services."""
    known = modules(root)
    routes = route_modules(root, known)
    assemblers = {f"{root.name}{name.removeprefix('opod')}" for name in ASSEMBLERS}
    return [
        f"{e.file}:{e.line}: {e.source} imports the route module {e.target}; call the area's service instead"
        for e in imports(root, known)
        if e.target in routes and e.source not in assemblers
    ]


def documented_layers(text: str) -> list[str]:
    """The first word of each unindented line in the code block under the doc's '## Layers' heading."""
    section = text.split("\n## Layers", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)\n```", section, flags=re.S)
    assert block, "docs/architecture.md's '## Layers' section has no code block listing the layers"
    return [line.split()[0] for line in block.group(1).splitlines() if line.strip() and not line[0].isspace()]


def _report(problems: list[str]) -> str:
    return "\n" + "\n".join(problems)


def test_no_package_imports_one_above_it() -> None:
    problems = scan(SRC).forbidden
    assert not problems, _report(problems)


def test_no_two_files_import_each_other() -> None:
    problems = scan(SRC).cycles
    assert not problems, _report(problems)


def test_every_package_has_a_place_in_the_layers() -> None:
    problems = scan(SRC).unplaced
    assert not problems, _report(problems)


def test_no_route_module_is_imported_but_by_the_list_of_areas() -> None:
    problems = route_module_imports(SRC)
    assert not problems, _report(problems)


def test_a_route_module_imported_by_the_leader_or_another_area_is_reported(tmp_path: Path) -> None:
    root = _fake_tree(
        tmp_path,
        {
            "__init__.py": "",
            "control/__init__.py": "",
            "control/models.py": "def router():\n    pass\n",
            "control/presets.py": "from opod.control.models import router\n\n\ndef router():\n    pass\n",
            "control/areas.py": "from opod.control import models, presets\n",
            "control/context.py": "",
            "leader/__init__.py": "",
            "leader/leader.py": "from opod.control.presets import router\nfrom opod.control.context import x\n",
        },
    )
    assert route_module_imports(root) == [
        "opod/control/presets.py:1: opod.control.presets imports the route module opod.control.models; "
        "call the area's service instead",
        "opod/leader/leader.py:1: opod.leader.leader imports the route module opod.control.presets; "
        "call the area's service instead",
    ]


def test_the_architecture_doc_lists_the_same_layers_in_the_same_order() -> None:
    assert documented_layers(DOC.read_text(encoding="utf-8")) == list(LAYERS)


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "opod"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_fake_tree_with_an_upward_edge_and_a_cycle_is_reported(tmp_path: Path) -> None:
    root = _fake_tree(
        tmp_path,
        {
            "__init__.py": "",
            "fleet/__init__.py": "",
            "fleet/state.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from opod.gateway.relay import Relay\n",
            "fleet/liveness.py": "def rule():\n    from . import router\n",
            "fleet/router.py": "from opod.fleet.liveness import rule\n",
            "gateway/__init__.py": "",
            "gateway/relay.py": "from opod.fleet import state\nfrom opod.control.keys import create\n",
            "control/__init__.py": "",
            "control/keys.py": "",
            "sim/__init__.py": "",
            "sim/server.py": "import opod.fleet.router\nfrom opod.http import serving\n",
            "http/__init__.py": "",
            "http/serving.py": "",
        },
    )
    found = scan(root)
    assert found.forbidden == [
        "opod/fleet/state.py:4: opod.fleet.state imports opod.gateway.relay; gateway is above fleet in the layers",
        "opod/gateway/relay.py:2: opod.gateway.relay imports opod.control.keys; gateway never imports control: "
        + NEVER["gateway", "control"],
        "opod/sim/server.py:1: opod.sim.server imports opod.fleet.router; sim imports only contract and http",
    ]
    assert found.cycles == [
        "import cycle between opod.fleet.liveness, opod.fleet.router: "
        "opod/fleet/liveness.py:2 (opod.fleet.liveness -> opod.fleet.router); opod/fleet/router.py:1 (opod.fleet.router -> opod.fleet.liveness)",
        "import cycle between opod.fleet.state, opod.gateway.relay: "
        "opod/fleet/state.py:4 (opod.fleet.state -> opod.gateway.relay); opod/gateway/relay.py:1 (opod.gateway.relay -> opod.fleet.state)",
    ]
    assert found.unplaced == []


def test_a_package_without_a_layer_and_an_import_from_the_root_package_are_reported(tmp_path: Path) -> None:
    root = _fake_tree(tmp_path, {"__init__.py": "from opod.tools import x\n", "tools/__init__.py": "x = 1\n"})
    found = scan(root)
    assert found.unplaced == ["opod/tools: a package with no place in the layers"]
    assert found.forbidden == [
        "opod/__init__.py:1: opod imports opod.tools; opod/__init__.py runs before every module of opod, so it imports none of them",
    ]
