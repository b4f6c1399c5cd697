"""A tiny random-weight BERT embedding GGUF for tests: ``llama-server --embeddings`` serves it at once.

Same writer as the MiniLM conversion (:mod:`opod.weights.bert_gguf`), with a
small WordPiece vocabulary (the specials, ASCII punctuation, letters and digits
as words and as ``##`` continuations, and the tiny llama's word list), so any
ASCII text tokenizes without unknown tokens. Deterministic for a seed.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from opod.weights.bert_gguf import SPECIALS, BertShape, write_bert_gguf
from opod.weights.tiny import WORDS


def tiny_wordpieces() -> list[str]:
    pieces: list[str] = list(SPECIALS)
    singles = [c for c in string.punctuation] + list(string.ascii_lowercase) + list(string.digits)
    pieces += singles + ["##" + c for c in string.ascii_lowercase + string.digits]
    pieces += [w for w in WORDS if w not in pieces]
    return pieces


def write_tiny_embedding_model(
    path: Path | str,
    *,
    seed: int = 0,
    layers: int = 2,
    dim: int = 32,
    heads: int = 2,
    ff: int = 64,
    context: int = 512,
    name: str = "opod-tiny-bert",
) -> Path:
    """Write a tiny BERT embedding GGUF (mean pooling, F32) to ``path`` atomically; returns the path."""
    if dim % heads:
        raise ValueError(f"write_tiny_embedding_model: dim ({dim}) must divide by heads ({heads})")
    pieces = tiny_wordpieces()
    rng = np.random.default_rng(seed)

    def random(*shape: int, std: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    ones, zeros = np.ones(dim, np.float32), np.zeros(dim, np.float32)
    tensors: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": random(len(pieces), dim, std=1.0),
        "embeddings.position_embeddings.weight": random(context, dim, std=0.1),
        "embeddings.token_type_embeddings.weight": random(2, dim, std=0.1),
        "embeddings.LayerNorm.weight": ones,
        "embeddings.LayerNorm.bias": zeros,
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for proj in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            tensors[p + proj + ".weight"] = random(dim, dim)
            tensors[p + proj + ".bias"] = random(dim, std=0.02)
        tensors[p + "attention.output.LayerNorm.weight"] = ones
        tensors[p + "attention.output.LayerNorm.bias"] = zeros
        tensors[p + "intermediate.dense.weight"] = random(ff, dim)
        tensors[p + "intermediate.dense.bias"] = random(ff, std=0.02)
        tensors[p + "output.dense.weight"] = random(dim, ff)
        tensors[p + "output.dense.bias"] = random(dim, std=0.02)
        tensors[p + "output.LayerNorm.weight"] = ones
        tensors[p + "output.LayerNorm.bias"] = zeros
    shape = BertShape(hidden=dim, layers=layers, heads=heads, ff=ff, context=context, layer_norm_eps=1e-12)
    return write_bert_gguf(
        Path(path), name=name, shape=shape, wordpieces=pieces, tensors=tensors, pooling="mean", f16=False
    )
