"""Whether a LoRA adapter fits the model it is listed under: the one rule, judged on what a worker read of it.

A worker reads the adapter's files (:mod:`opod.worker.adapter_files`) and says what they state: its rank, the
model it was trained on, the architecture it was trained for, with the largest rank the engine serving the base
was started for and the architecture of the weights it serves. Here those facts meet the model's definition.
What neither side knows (a config without ``base_model_name_or_path``, a base whose weights the engine resolves
by name) is not held against the adapter: only a stated mismatch refuses it.
"""

from __future__ import annotations

import re

from opod.contract.admin.catalog import CatalogModel
from opod.contract.nodeapi import Adapter, AdapterFacts

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HEADS = ("forcausallm", "forconditionalgeneration", "lmheadmodel", "model")


def architecture_key(name: str) -> str:
    """``LlamaForCausalLM``, ``llama`` (a GGUF's) and ``LlamaModel`` are one architecture: ``llama``."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    for head in _HEADS:
        if key.endswith(head) and len(key) > len(head):
            return key.removesuffix(head)
    return key


def repositories(definition: CatalogModel, entry_repo: str = "") -> list[str]:
    """The Hugging Face repositories the model's weights come from, as its definition (or catalog entry) names them."""
    named = [definition.source or "", (definition.origin.repo or "") if definition.origin else "", entry_repo]
    out = []
    for text in named:
        repo = text.removeprefix("hf:").removeprefix("hf://").strip("/")
        if _REPO.match(repo) and not repo.lower().endswith(".gguf") and repo not in out:
            out.append(repo)
    return out


def _same_model(trained_on: str, repos: list[str]) -> bool:
    """A mirror under another owner (``unsloth/X`` for ``meta-llama/X``) is the same model."""
    wanted = trained_on.strip("/").lower()
    tail = wanted.rsplit("/", 1)[-1]
    return any(wanted == r.lower() or tail == r.rsplit("/", 1)[-1].lower() for r in repos)


def misfit(definition: CatalogModel, facts: AdapterFacts, entry_repo: str = "") -> str:
    """Why the adapter cannot serve on this model, or ``""`` when nothing stated says it cannot."""
    model = definition.name or "the model"
    if facts.max_rank and facts.rank > facts.max_rank:
        return (
            f"its rank is {facts.rank}, above the {facts.max_rank} the engine serving {model} takes (max_lora_rank); "
            f"start its engine for a larger rank (the engine flag max_lora_rank) and reload it, or train the "
            f"adapter with r <= {facts.max_rank}"
        )
    if facts.architecture and facts.base_architecture:
        if architecture_key(facts.architecture) != architecture_key(facts.base_architecture):
            return (
                f"it was trained for the {facts.architecture} architecture, but {model} serves "
                f"{facts.base_architecture} weights; list it under a model of its architecture"
            )
    repos = repositories(definition, entry_repo)
    if facts.base_model and repos and not _same_model(facts.base_model, repos):
        return (
            f"it was trained on {facts.base_model}, not on {model}'s weights ({', '.join(repos)}); "
            "list it under the model it was trained on"
        )
    return ""


def load_adapters(definition: CatalogModel | None) -> list[Adapter] | None:
    """What a load request carries of a model's adapters, attached by the worker once the model serves."""
    adapters = (definition.adapters if definition is not None else None) or []
    return [Adapter(name=a.name or "", source=a.source or "") for a in adapters] or None
