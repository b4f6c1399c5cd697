"""What a registry repository offers, read from the Hub without downloading its weights.

:func:`read_repository` asks the Hub for the repository's commit, files, gate and licence, groups
its files into artifacts (each GGUF quantisation, a split one as one; the original safetensors as
one set) and reads the model's shape from the start of a GGUF or from ``config.json``, so a plan
can size each way of running it, KV cache included.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from opod.contract.catalog import Architecture
from opod.weights.choose import HubFile, gguf_candidates
from opod.weights.gguf_header import HEADER_BYTES, read_metadata, shape
from opod.weights.hub import HubClient

FORMATS = ("gguf", "safetensors")

BITS_PER_WEIGHT: dict[str, float] = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.56,
    "Q5_1": 6.0,
    "Q5_K_M": 5.69,
    "Q5_K_S": 5.54,
    "Q5_0": 5.5,
    "Q4_1": 5.0,
    "Q4_K_M": 4.89,
    "Q4_K_S": 4.58,
    "Q4_0": 4.5,
    "IQ4_NL": 4.5,
    "IQ4_XS": 4.25,
    "Q3_K_L": 4.27,
    "Q3_K_M": 3.91,
    "IQ3_M": 3.66,
    "Q3_K_S": 3.5,
    "IQ3_XXS": 3.06,
    "Q2_K": 2.96,
    "IQ2_XS": 2.31,
    "IQ2_XXS": 2.06,
    "IQ1_S": 1.56,
}
"""llama.cpp's quantisations and the bits each weight takes in them, on average."""

PREFERENCE = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_K_S", "Q5_K_S", "Q4_0", "IQ4_XS", "Q3_K_M", "Q3_K_L")
"""Quantisations in the order a plan offers them when several fit: quality for the size first."""

_QUANT = re.compile(r"^(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|FP16)$", re.IGNORECASE)
_DTYPE_BITS = {"bfloat16": 16.0, "float16": 16.0, "float32": 32.0}
README_BYTES = 8192
CONFIG_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Artifact:
    """One way the repository ships the model: a GGUF quantisation (its parts), or the original safetensors."""

    name: str
    format: str
    files: tuple[HubFile, ...]
    quant: str
    bits_per_weight: float
    """0 when unknown."""

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True, slots=True)
class Repository:
    repo: str
    revision: str
    """The commit the repository's head pointed at when it was read."""
    gated: bool
    license: str
    architecture: str
    shape: Architecture
    trained_context: int
    params: int
    artifacts: tuple[Artifact, ...]
    projectors: tuple[str, ...]
    files: tuple[HubFile, ...]
    notes: list[str] = field(default_factory=list)

    def of_format(self, format: str) -> list[Artifact]:
        return [a for a in self.artifacts if a.format == format]


def quant_of(path: str) -> str:
    """The quantisation a GGUF's name says (``model-Q4_K_M.gguf``: ``Q4_K_M``); empty when it says none."""
    stem = PurePosixPath(path).name.removesuffix(".gguf")
    for part in reversed(re.split(r"[-.]", stem)):
        if _QUANT.match(part):
            return "F16" if part.upper() == "FP16" else part.upper()
    return ""


def _license(raw: dict[str, Any], readme: str) -> str:
    card = raw.get("cardData")
    if isinstance(card, dict) and isinstance(card.get("license"), str):
        return str(card["license"])
    for tag in raw.get("tags") or []:
        if isinstance(tag, str) and tag.startswith("license:"):
            return tag.removeprefix("license:")
    if readme.startswith("---"):
        for line in readme.split("\n---", 1)[0].splitlines():
            if line.startswith("license:"):
                return line.removeprefix("license:").strip().strip("'\"")
    return ""


def _gguf_artifacts(files: list[HubFile]) -> list[Artifact]:
    out = []
    for choice in gguf_candidates(files):
        quant = quant_of(choice.first.path)
        name = choice.first.path if len(choice.files) == 1 else re.sub(r"-\d{5}-of-\d{5}", "", choice.first.path)
        out.append(Artifact(name, "gguf", choice.files, quant, BITS_PER_WEIGHT.get(quant, 0.0)))
    return out


def _config_shape(config: dict[str, Any]) -> tuple[str, Architecture, int, float]:
    """(architecture, shape, trained context, bits per weight) from a transformers ``config.json``."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, dict)

    def number(*keys: str) -> int:
        for key in keys:
            value = text.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return 0

    heads = number("num_attention_heads")
    width = number("hidden_size")
    layers = number("num_hidden_layers")
    window = number("sliding_window") if text.get("use_sliding_window", True) else 0
    arch = (config.get("architectures") or [config.get("model_type") or ""])[0]
    return (
        str(arch),
        Architecture(
            layers=layers,
            heads=heads,
            kv_heads=number("num_key_value_heads") or heads,
            head_dim=number("head_dim") or (width // heads if heads and width else 0),
            kv_lora_rank=number("kv_lora_rank"),
            qk_rope_head_dim=number("qk_rope_head_dim"),
            sliding_window=window,
            sliding_window_layers=layers // 2 if window else 0,
        ),
        number("max_position_embeddings"),
        _DTYPE_BITS.get(str(text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16"), 16.0),
    )


async def read_repository(hub: HubClient, repo: str, format: str) -> Repository:
    """The repository at the hub's head, its artifacts of every format, its shape read for ``format``.

    Raises :class:`~opod.weights.hub.HubError` (missing, gated, refused) or ``WeightsError`` (unreachable).
    """
    info = await hub.model_info(repo)
    revision = info.sha or hub.settings.revision
    files = await hub.list_files(repo, revision)
    names = {f.path for f in files}
    readme = ""
    if "README.md" in names:
        readme = (await hub.read_start(repo, "README.md", revision, README_BYTES)).decode(errors="replace")
    notes: list[str] = []
    artifacts = _gguf_artifacts(files)
    weights = [f for f in files if f.path.endswith(".safetensors")]
    architecture, arch, context, params = "", Architecture(), 0, 0
    config: dict[str, Any] = {}
    if "config.json" in names:
        try:
            loaded = json.loads(await hub.read_start(repo, "config.json", revision, CONFIG_BYTES))
            config = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            notes.append("config.json is not JSON: the model's shape is unknown")
    if weights:
        bits = _config_shape(config)[3] if config else 16.0
        quant = "bf16" if bits == 16.0 else f"{bits:g}-bit"
        artifacts.append(Artifact("original", "safetensors", tuple(weights), quant, bits))
    if format == "safetensors" and config:
        architecture, arch, context, _ = _config_shape(config)
    elif format == "gguf" and artifacts and artifacts[0].format == "gguf":
        smallest = min((a for a in artifacts if a.format == "gguf"), key=lambda a: a.bytes)
        try:
            meta = read_metadata(await hub.read_start(repo, smallest.files[0].path, revision, HEADER_BYTES))
            found = shape(meta)
            architecture, arch, context = found.architecture, found.shape, found.context
        except ValueError as err:
            notes.append(f"{smallest.files[0].path}: {err}; the model's shape is unknown")
    summary = info.raw.get("gguf" if format == "gguf" else "safetensors")
    if isinstance(summary, dict) and isinstance(summary.get("total"), int):
        params = int(summary["total"])
    else:
        sized = [a for a in artifacts if a.format == format and a.bits_per_weight]
        if sized:
            params = int(sized[0].bytes * 8 / sized[0].bits_per_weight)
            notes.append("parameters estimated from the file sizes")
    projectors = tuple(sorted(f.path for f in files if f.path.endswith(".gguf") and "mmproj" in f.path.lower()))
    return Repository(
        repo=repo,
        revision=revision,
        gated=bool(info.gated),
        license=_license(info.raw, readme),
        architecture=architecture,
        shape=arch.model_copy(update={"params": params}) if params else arch,
        trained_context=context,
        params=params,
        artifacts=tuple(artifacts),
        projectors=projectors,
        files=tuple(files),
        notes=notes,
    )
