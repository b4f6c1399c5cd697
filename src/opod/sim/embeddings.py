"""Deterministic embeddings: a unit vector per (model, text), the same on every run and machine."""

from __future__ import annotations

import base64
import hashlib

import numpy as np

__all__ = ["embed", "encode_base64"]


def embed(model: str, text: str, dim: int) -> np.ndarray:
    """A float32 unit vector seeded by the model name and the text."""
    seed = int.from_bytes(hashlib.blake2b(f"{model}\x00{text}".encode(), digest_size=8).digest(), "big")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm else v


def encode_base64(v: np.ndarray) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32 bytes."""
    return base64.b64encode(v.astype("<f4").tobytes()).decode()
