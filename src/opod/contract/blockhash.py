"""Prefix-cache block hashes (CONTRACT.md §4.7): a protocol constant, not an implementation detail.

A block is ``block_size`` consecutive prompt tokens. Its hash chains from the
block before it, so one hash names a whole prefix. Workers report these hashes
in heartbeats and the leader computes them for a request; both sides must get
the same bytes, so changing this function is a protocol change.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

__all__ = ["BLOCK_HASH_SEED", "block_hash", "block_hashes"]

BLOCK_HASH_SEED = "opod-kv-block-v1"

_U64 = struct.Struct(">Q")
_MASK = 0xFFFFFFFFFFFFFFFF


def block_hash(parent: str, tokens: Sequence[int]) -> str:
    """Hash one block: SHA-256 of the parent's hex text (or the seed) then each token as big-endian u64.

    Returns the first 8 bytes of the digest as 16 lowercase hex characters.
    Negative token ids are written as their 64-bit two's complement.
    """
    return _chain(parent, _pack(tokens))


def _pack(tokens: Sequence[int]) -> bytes:
    return struct.pack(f">{len(tokens)}Q", *[t & _MASK for t in tokens])


def _chain(parent: str, packed: bytes) -> str:
    return hashlib.sha256((parent or BLOCK_HASH_SEED).encode() + packed).hexdigest()[:16]


def block_hashes(tokens: Sequence[int], block_size: int, parent: str = "") -> list[str]:
    """The chained hash of every full block; a trailing partial block is dropped.

    The chain starts from ``parent`` (empty: the seed, as the contract has it); the simulator
    starts a LoRA adapter's chain elsewhere so that its blocks never match the base model's.
    """
    if block_size <= 0:
        return []
    whole = len(tokens) // block_size * block_size
    if not whole:
        return []
    # One pack for the whole prompt, then a slice per block: a fraction of the cost of packing
    # block by block for a long prompt (the leader hashes every request's prompt).
    packed = _pack(tokens[:whole])
    step = block_size * _U64.size
    out: list[str] = []
    for start in range(0, len(packed), step):
        parent = _chain(parent, packed[start : start + step])
        out.append(parent)
    return out
