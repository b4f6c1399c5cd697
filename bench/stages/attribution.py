"""Which stage of a ``/v1`` request each profiled function's time belongs to.

:data:`STAGES` is the one table from stages to opod's functions: when the gateway's functions are renamed
or moved, it is the one place to update, and :func:`resolve` fails naming every entry that no longer
exists. A function named there is its stage's, with everything it calls except what another entry names.
A function named nowhere takes the stages of its callers, in proportion to the time each call edge spent.

The event loop starts tasks and protocol callbacks itself, so their call edges from the request are lost:
a function the loop called is given the split of the rest of its package's time (an aiohttp client's
socket callbacks go where that client's requests were made), and opod's own code called by the loop and
named nowhere is :data:`BACKGROUND`. What is left is the HTTP server, the framework and the loop itself.

``cProfile`` sees a coroutine once per resumption, so a function's time here is its time on the stack:
the waits inside an ``await`` (the engine's answer, a webhook's) are never in it.
"""

from __future__ import annotations

import importlib.util
import pstats
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

Func = tuple[str, int, str]
"""A function as ``pstats`` names it: file, first line, name."""

GLUE = "handler's own code (Gateway.serve)"
BACKGROUND = "background (heartbeats, followers, loops)"
SERVER = "HTTP server, framework and event loop (rest)"

STAGES: dict[str, tuple[str, ...]] = {
    "authentication and attribution": (
        "opod.gateway.app:Gateway.authenticate",
        "opod.access.keytable:KeyTable.*",
        "opod.gateway.exchange:Exchange.identified",
        "opod.access.tenancy:Tenancy.chain",
    ),
    "validation (body, JSON, route rules)": (
        "opod.http.fastpath:headers_of",
        "opod.http.fastpath:header_map",
        "opod.http.fastpath:read_whole",
        "opod.http.inbound:*",
        "opod.gateway.validate:*",
        "opod.gateway.routes:*",
        "opod.gateway.promptsize:*",
        "opod.gateway.app:Gateway.resolve_model",
        "opod.gateway.app:Gateway.known_name",
        "opod.gateway.app:Gateway._named",
        "opod.gateway.traits:*",
    ),
    "budget reserve and settle (pricing, prompt count)": (
        "opod.gateway.budgets:*",
        "opod.gateway.app:Gateway.reserve",
        "opod.gateway.app:Gateway.template_cost",
        "opod.gateway.app:Gateway.count_prompt",
        "opod.gateway.exchange:Exchange.reserved",
        "opod.gateway.exchange:Exchange.counted",
        "opod.gateway.exchange:Exchange.capped",
        "opod.gateway.templatecost:*",
        "opod.gateway.usagecount:PromptCounter.count_now",
        "opod.gateway.tokenize:*",
    ),
    "guardrails (guard policies in process; pre, post webhooks)": (
        "opod.gateway.guard:*",
        "opod.gateway.app:Gateway.guard_plan",
        "opod.gateway.guardrails:*",
        "opod.gateway.exchange:Exchange.guarded",
        "opod.gateway.app:Gateway._after",
    ),
    "kept bodies (plan, keep, write)": (
        "opod.gateway.kept_bodies:BodyKeeping.*",
        "opod.gateway.kept_bodies:capped",
        "opod.gateway.kept_bodies:without_nul",
        "opod.gateway.kept_bodies:StreamText.*",
        "opod.ledger.bodies:*",
        "opod.gateway.exchange:Exchange.keeping",
    ),
    "admission": (
        "opod.gateway.admission:*",
        "opod.gateway.fairqueue:*",
        "opod.gateway.exchange:Exchange.admitted",
    ),
    "routing (route_request, the router's pick)": (
        "opod.gateway.app:Gateway.routing_policy",
        "opod.gateway.app:Gateway.route_request",
        "opod.gateway.profiles:routing_policy",
        "opod.fleet.router:*",
        "opod.gateway.prefix:*",
        "opod.gateway.exchange:Exchange.routed",
        "opod.gateway.exchange:Exchange.fell_back",
    ),
    "relay (to the engine and back, opod's part)": (
        "opod.gateway.relay:*",
        "opod.http.upstream:*",
        "opod.http.fastpath:PreparedResponse.*",
        "opod.gateway.exchange:Exchange.leased",
    ),
    "usage record (ledger begin/end, journal, counters)": (
        "opod.gateway.exchange:Exchange.parsed",
        "opod.gateway.exchange:Exchange.relaying",
        "opod.gateway.exchange:Exchange.sent",
        "opod.gateway.exchange:Exchange.ended",
        "opod.gateway.exchange:Exchange._journal_start",
        "opod.gateway.exchange:Exchange.details",
        "opod.gateway.exchange:Exchange.let_through",
        "opod.gateway.kept_bodies:request_labels",
        "opod.gateway.stats:*",
        "opod.gateway.usagecount:DecodeRates.*",
        "opod.ledger.ledger:*",
        "opod.ledger.journal:*",
        "opod.ledger.records:*",
        "opod.ledger.writer:*",
    ),
    "audit": (
        "opod.store.audit:*",
        "opod.control.audit:*",
    ),
    GLUE: (
        "opod.gateway.app:Gateway._endpoint.<locals>.endpoint",
        "opod.gateway.app:Gateway.serve",
        "opod.gateway.exchange:Exchange.__init__",
    ),
    BACKGROUND: ("opod.leader.nodes:NodeRegistry.*",),
    SERVER: (
        "opod.http.fastpath:FastHttpProtocol.*",
        "opod.http.fastpath:FastPath.*",
        "opod.http.fastpath:_Exchange.*",
        "opod.http.fastpath:_answer_unless_left",
        "opod.http.fastpath:_close",
    ),
}
ORDER = list(STAGES)
FRAMEWORK = frozenset({"uvicorn", "starlette", "httptools", "uvloop", "~"})
"""Packages whose functions the event loop calls are the server's: the loop's own C work, the HTTP protocol."""


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _module_functions(module: str) -> dict[str, Func]:
    """Every function of ``module`` by its qualified name, as the profiler will name it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(module)
    source = Path(spec.origin)
    top = compile(source.read_text(), spec.origin, "exec")
    return {c.co_qualname: (c.co_filename, c.co_firstlineno, c.co_name) for c in _codes(top) if c is not top}


def resolve() -> dict[Func, str]:
    """Each function :data:`STAGES` names → its stage; raises naming every entry that matches nothing."""
    exact: dict[Func, str] = {}
    wide: dict[Func, str] = {}
    missing: list[str] = []
    cache: dict[str, dict[str, Func]] = {}
    for stage, names in STAGES.items():
        for name in names:
            module, _, qualname = name.partition(":")
            try:
                functions = cache.setdefault(module, _module_functions(module))
            except (LookupError, ModuleNotFoundError):
                missing.append(name)
                continue
            if qualname.endswith("*"):
                found = {f for q, f in functions.items() if q.startswith(qualname[:-1])}
                wide.update(dict.fromkeys(found, stage))
            elif qualname in functions:
                found = {functions[qualname]}
                exact[functions[qualname]] = stage
            else:
                found = set()
            if not found:
                missing.append(name)
    if missing:
        raise LookupError("bench.stages.attribution.STAGES names functions opod no longer has: " + ", ".join(missing))
    return {**wide, **exact}


def _package(func: Func) -> str:
    """The package a function's file belongs to: ``aiohttp``, ``asyncio``; opod's own as ``opod``."""
    if func[0] == "~":
        return "~"
    parts = Path(func[0]).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    if "opod" in parts:
        return "opod"
    stdlib = [i for i, part in enumerate(parts) if part.startswith("python3")]
    if stdlib and stdlib[-1] + 1 < len(parts):
        return parts[stdlib[-1] + 1].removesuffix(".py")
    return Path(func[0]).stem


def _is_loop(func: Func) -> bool:
    """The event loop's own run method: what calls tasks and protocol callbacks."""
    return func[0] == "~" and "'run'" in func[2] and "Loop" in func[2] or func[2] in ("run_forever", "_run_once")


@dataclass
class Attributed:
    seconds: dict[str, float]
    """Each stage's seconds in the profile (every row of :data:`ORDER`)."""
    total: float
    """Seconds of everything profiled on the event loop's thread."""


def attribute(stats: pstats.Stats, named: dict[Func, str], rounds: int = 40) -> Attributed:
    """Each function's own time shared among the stages, as the module docstring says."""
    table = stats.stats  # type: ignore[attr-defined]
    own: dict[Func, float] = {f: row[2] for f, row in table.items()}
    callers: dict[Func, dict[Func, float]] = {f: {c: edge[3] for c, edge in row[4].items()} for f, row in table.items()}
    weights: dict[Func, dict[str, float]] = {f: {named.get(f, SERVER): 1.0} for f in table}
    inner = {f for f, by in callers.items() if any(not _is_loop(c) for c in by)}
    for _ in range(rounds):
        prior = _package_split(own, weights, inner)
        changed = False
        for func in table:
            if func in named:
                continue
            mix: dict[str, float] = defaultdict(float)
            looped = 0.0
            for caller, edge in callers[func].items():
                if _is_loop(caller):
                    looped += edge
                    continue
                for stage, share in weights.get(caller, {SERVER: 1.0}).items():
                    mix[stage] += edge * share
            if not callers[func] or looped:
                rest = looped or 1.0
                package = _package(func)
                if package == "opod":
                    mix[BACKGROUND] += rest
                elif package in FRAMEWORK:
                    mix[SERVER] += rest
                else:
                    for stage, share in prior.get(package, {SERVER: 1.0}).items():
                        mix[stage] += rest * share
            whole = sum(mix.values())
            new = {s: v / whole for s, v in mix.items()} if whole > 0 else {SERVER: 1.0}
            if new != weights[func]:
                weights[func], changed = new, True
        if not changed:
            break
    seconds = dict.fromkeys(ORDER, 0.0)
    for func, spent in own.items():
        for stage, share in weights[func].items():
            seconds[stage] += spent * share
    return Attributed(seconds, sum(own.values()))


def _package_split(
    own: dict[Func, float], weights: dict[Func, dict[str, float]], inner: set[Func]
) -> dict[str, dict[str, float]]:
    """Each package's own time in functions a request's code called, split among the stages as they are now."""
    split: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for func, spent in own.items():
        if func not in inner:
            continue
        for stage, share in weights[func].items():
            split[_package(func)][stage] += spent * share
    out: dict[str, dict[str, float]] = {}
    for package, stages in split.items():
        whole = sum(stages.values())
        if whole > 0:
            out[package] = {s: v / whole for s, v in stages.items()}
    return out
