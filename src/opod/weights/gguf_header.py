"""A GGUF file's metadata read from its first bytes: what a plan needs without downloading the weights.

A GGUF begins with its key-value metadata (the architecture's keys before the tokenizer's long
arrays), so a ranged read of its start holds the shape of the model. :func:`read_metadata` reads
the pairs in order and stops, keeping what it read, where the bytes end; arrays are skipped
(a per-layer array of head counts is kept as its largest value). :func:`shape` turns the
llama.cpp keys (``{arch}.block_count``, ``{arch}.attention.head_count_kv``, ...) into the
catalog's :class:`~opod.contract.catalog.Architecture`, from which the KV cache is sized.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from opod.contract.catalog import Architecture

MAGIC = b"GGUF"
HEADER_BYTES = 256 * 1024
"""What a plan reads of a GGUF: the general and architecture keys come well within it."""

_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class _Short(Exception):
    """The bytes ended inside a pair."""


@dataclass(slots=True)
class _Reader:
    data: bytes
    at: int = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Short
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def unpack(self, fmt: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def string(self) -> str:
        length = int(self.unpack("<Q"))
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = int(self.unpack("<I")), int(self.unpack("<Q"))
            if inner in _SCALARS and inner != 7:
                size = struct.calcsize(_SCALARS[inner])
                if count <= 4096:  # a per-layer array: its largest value is what sizing needs
                    values = struct.unpack(f"<{count}{_SCALARS[inner][1]}", self.take(size * count))
                    return max(values) if values else 0
                self.take(size * count)
                return None
            for _ in range(count):
                self.value(inner)
            return None
        raise ValueError(f"unknown GGUF value type {kind}")


def read_metadata(data: bytes) -> dict[str, object]:
    """The key-value pairs in ``data`` (a GGUF's start), as far as it goes; ``ValueError`` when it is no GGUF."""
    if data[:4] != MAGIC:
        raise ValueError("not a GGUF file (it does not begin with GGUF)")
    reader = _Reader(data, 4)
    found: dict[str, object] = {}
    try:
        version = int(reader.unpack("<I"))
        if version < 2:
            raise ValueError(f"GGUF version {version} is older than llama.cpp reads")
        reader.unpack("<Q")  # tensors
        pairs = int(reader.unpack("<Q"))
        for _ in range(pairs):
            key = reader.string()
            found[key] = reader.value(int(reader.unpack("<I")))
    except _Short:
        pass
    return found


def _int(meta: dict[str, object], key: str) -> int:
    value = meta.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class GGUFShape:
    architecture: str
    context: int
    """The context it was trained for; 0 when the header does not say."""
    shape: Architecture


def shape(meta: dict[str, object]) -> GGUFShape:
    """The model's architecture as the header states it; a key it lacks is 0 (unknown)."""
    arch = str(meta.get("general.architecture") or "")
    heads = _int(meta, f"{arch}.attention.head_count")
    width = _int(meta, f"{arch}.embedding_length")
    layers = _int(meta, f"{arch}.block_count")
    window = _int(meta, f"{arch}.attention.sliding_window")
    latent = _int(meta, f"{arch}.attention.kv_lora_rank")
    return GGUFShape(
        architecture=arch,
        context=_int(meta, f"{arch}.context_length"),
        shape=Architecture(
            layers=layers,
            heads=heads,
            kv_heads=_int(meta, f"{arch}.attention.head_count_kv") or heads,
            head_dim=_int(meta, f"{arch}.attention.key_length") or (width // heads if heads and width else 0),
            experts=_int(meta, f"{arch}.expert_count"),
            kv_lora_rank=latent,
            qk_rope_head_dim=_int(meta, f"{arch}.rope.dimension_count") if latent else 0,
            sliding_window=window,
            # The header does not say which layers are windowed; models that mix them keep about half full.
            sliding_window_layers=layers // 2 if window else 0,
        ),
    )
