"""What a worker reads of a LoRA adapter's files before anything attaches it, and of the weights its base serves.

The engines that attach adapters at run time (vLLM, and the simulator that speaks its API) take a PEFT
adapter directory: ``adapter_config.json`` beside the weights. What it says (its rank ``r``, the model it was
trained on, the architecture PEFT recorded) goes back to the leader, which judges it against the model's
definition (:mod:`opod.catalog.adapters`); here only what cannot be read is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from opod.contract import nodeapi
from opod.weights.gguf_header import read_metadata
from opod.worker.refusals import AdapterRefused

CONFIG = "adapter_config.json"
HEADER_BYTES = 1 << 16
"""What is read of a GGUF to find its architecture: the general keys come first."""


def read_adapter(name: str, source: str) -> nodeapi.AdapterFacts:
    """The adapter at ``source`` as its config states it; ``AdapterRefused`` (400) when it is missing or unreadable."""
    path = Path(source)
    if not path.exists():
        raise AdapterRefused(
            400, f"source {source!r}: not found on this node; give the path of a PEFT adapter directory here"
        )
    if not path.is_dir():
        raise AdapterRefused(
            400, f"source {source!r}: is a file; runtime LoRA takes a PEFT adapter directory holding {CONFIG}"
        )
    try:
        config = json.loads((path / CONFIG).read_text())
    except FileNotFoundError:
        raise AdapterRefused(400, f"source {source!r}: has no {CONFIG}; is it a PEFT adapter directory?") from None
    except OSError as err:
        raise AdapterRefused(400, f"source {source!r}: {CONFIG} cannot be read: {err.strerror or err}") from None
    except ValueError as err:
        raise AdapterRefused(400, f"source {source!r}: {CONFIG} is not JSON: {err}") from None
    if not isinstance(config, dict):
        raise AdapterRefused(400, f"source {source!r}: {CONFIG} is not a JSON object")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise AdapterRefused(400, f"source {source!r}: {CONFIG} gives no rank (r, a whole number above 0)")
    mapping = config.get("auto_mapping")
    architecture = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    base = config.get("base_model_name_or_path")
    return nodeapi.AdapterFacts(
        name=name,
        source=source,
        rank=rank,
        base_model=base if isinstance(base, str) else "",
        architecture=architecture if isinstance(architecture, str) else "",
    )


def weights_architecture(weights: str) -> str:
    """The architecture of the weights an engine loads (a model directory's ``config.json``, or a GGUF's header);
    ``""`` when it cannot be read (a name the engine resolves itself, the simulator's)."""
    path = Path(weights)
    try:
        if path.is_dir():
            config = json.loads((path / "config.json").read_text())
            names = config.get("architectures") if isinstance(config, dict) else None
            if isinstance(names, list) and names and isinstance(names[0], str):
                return names[0]
            kind = config.get("model_type") if isinstance(config, dict) else None
            return kind if isinstance(kind, str) else ""
        if path.is_file():
            with path.open("rb") as handle:
                meta = read_metadata(handle.read(HEADER_BYTES))
            return str(meta.get("general.architecture") or "")
    except (OSError, ValueError):
        return ""
    return ""
