"""Choosing which GGUF of a hub repository to serve when the catalog names none.

A GGUF repository usually holds one file per quantization. Q4_K_M is the
common balance of size and quality, so it wins; otherwise the smallest file.
A model split into ``-00001-of-0000N.gguf`` parts counts as one choice whose
size is the sum of its parts, and is chosen only when every part is present.
Vision projectors (``mmproj``) are not models and are never chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from opod.weights.errors import WeightsError

PREFERRED_QUANT = "Q4_K_M"
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class HubFile:
    """One file of a repository at a revision, as the hub's tree listing describes it."""

    path: str
    size: int
    sha256: str | None = None
    """The LFS object id (the file's SHA-256); ``None`` for a file kept in git itself."""
    git_oid: str | None = None


@dataclass(frozen=True, slots=True)
class GGUFChoice:
    files: tuple[HubFile, ...]
    """The parts in order; one file for an unsplit model. The engine is given the first."""

    @property
    def first(self) -> HubFile:
        return self.files[0]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def _candidates(files: list[HubFile]) -> list[GGUFChoice]:
    singles: list[GGUFChoice] = []
    shards: dict[str, dict[int, HubFile]] = {}
    counts: dict[str, int] = {}
    for f in files:
        name = PurePosixPath(f.path).name
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        match = _SHARD.match(f.path)
        if match:
            key = match.group("stem")
            shards.setdefault(key, {})[int(match.group("index"))] = f
            counts[key] = int(match.group("count"))
        else:
            singles.append(GGUFChoice((f,)))
    for key, parts in shards.items():
        if sorted(parts) == list(range(1, counts[key] + 1)):
            singles.append(GGUFChoice(tuple(parts[i] for i in sorted(parts))))
    return singles


def gguf_candidates(files: list[HubFile]) -> list[GGUFChoice]:
    """Every GGUF model of a repository's files (each quantisation; a split model as one), projectors left out."""
    return _candidates(files)


def choose_gguf(files: list[HubFile], where: str = "the repository") -> GGUFChoice:
    """The GGUF to serve from a repository's files; a repository without one is a clear error."""
    candidates = _candidates(files)
    if not candidates:
        listed = ", ".join(sorted(f.path for f in files)[:12]) or "no files"
        raise WeightsError(
            f"{where} has no GGUF model file ({listed}). opod serves hub models with llama.cpp, which needs GGUF: "
            "choose a GGUF repository (often named …-GGUF) or name the file in the catalog entry (source.file)"
        )
    preferred = [c for c in candidates if PREFERRED_QUANT.lower() in c.first.path.lower()]
    pool = preferred or candidates
    return min(pool, key=lambda c: (c.size, c.first.path))
