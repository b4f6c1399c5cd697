"""``opod sim``: an OpenAI-compatible engine simulator that speaks vLLM's, SGLang's, llama.cpp's or Ollama's wire.

It has a latency model, a block prefix cache named by the contract's block
hashes, each engine's metrics and extra endpoints, vLLM's KV-cache events,
failure injection and a seed. Fleet tests and benchmarks run on it::

    from opod.sim import SimConfig, build_app, running, serve

    with running(SimConfig(port=0, time_scale=0)) as sim:   # a thread; sim.url is http://127.0.0.1:PORT
        ...

Endpoints by dialect (every dialect also has ``/sim/faults`` and ``/sim/state``):

* all but ollama: ``GET /v1/models``, ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``;
* ``vllm``: ``/health``, ``/ping``, ``/version``, ``/load``, ``/kv_event_sources``, ``/tokenize``,
  ``/detokenize``, ``/v1/chat/completions/render``, ``/sleep?level=N``, ``/wake_up``, ``/is_sleeping``,
  ``/reset_prefix_cache``, ``/metrics``; with ``--enable-lora`` also ``/v1/load_lora_adapter`` and
  ``/v1/unload_lora_adapter`` (an adapter answers under its ``lora_name``);
* ``sglang``: ``/health``, ``/health_generate``, ``/server_info``, ``/get_server_info``, ``/get_model_info``,
  ``/get_load``, ``/flush_cache``, ``/metrics``;
* ``llamacpp``: ``/health`` and ``/v1/health`` (503 "Loading model" while loading), ``/models``, ``/props``,
  ``/slots``, ``/tokenize``, ``/detokenize``, ``/apply-template``, ``/metrics``;
* ``ollama``: ``/``, ``/api/version``, ``/api/tags``, ``/api/ps``, ``/api/generate``, ``/api/chat``,
  ``/api/embed``, ``/api/embeddings``, ``/api/show``, and the ``/v1`` routes above.
"""

import importlib
from typing import Any

from opod.sim.config import SimConfig, SimConfigError

# The server side (Starlette, uvicorn, zmq) loads on first use, so `opod --help` stays quick.
_LAZY = {
    "build_app": "opod.sim.app",
    "SimHandle": "opod.sim.server",
    "running": "opod.sim.server",
    "serve": "opod.sim.server",
}

__all__ = ["SimConfig", "SimConfigError", "SimHandle", "build_app", "running", "serve"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'opod.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
