"""The builds each engine has, which an operator chooses between per node (``POST /api/v1/nodes/{id}/engines``).

The leader refuses a build an engine does not have before recording it; the worker carries a choice
out (:mod:`opod.worker.builds`). ``auto`` is what the worker does by itself, ``none`` takes the
engine out of use on the node.
"""

from __future__ import annotations

from opod.engines import llama_binary

AUTO, NONE = "auto", "none"
_TORCH_BUILDS = ("cpu", "cu126", "cu128", "cu129", "cu130")
BUILDS: dict[str, tuple[str, ...]] = {
    "llamacpp": (AUTO, NONE, *(route.value for route in llama_binary.Route)),
    "vllm": (AUTO, NONE, *_TORCH_BUILDS),
    "sglang": (AUTO, NONE, *_TORCH_BUILDS),
    "ollama": (AUTO, NONE),
    "sim": (AUTO, NONE),
}
"""Engine id → every build a node could install; Ollama is the operator's daemon and the simulator is opod itself."""


def builds_of(engine: str) -> tuple[str, ...]:
    """The builds ``engine`` has (``()`` for an engine opod does not run)."""
    return BUILDS.get(engine, ())
