"""A model's fallbacks: the models tried, in order, when it cannot serve a request, and the rules a list keeps.

A model added through the management API keeps its list in its definition (``fallbacks``, replaced
whole by ``PUT /api/v1/models/{name}/fallbacks``); a model of the catalog file keeps the entry's
``fallback``. The gateway reads :func:`fallbacks_of` and nothing else. A list is refused whole when an
item is empty, repeated, the model itself, a model the catalog does not have, a federation peer's
model (``PEER/MODEL``) of a peer not known, or when it closes a cycle through other models' lists
(a request would go round it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from opod.fleet.models import KnownModel, ModelRegistry

PEER_MARK = "/"
"""``PEER/MODEL`` names a federation peer's model; a model of this catalog never has a ``/`` in its name."""


class PeerModels(Protocol):
    """The federation's peers and the models they offer, as the rules of a list read them."""

    def names(self) -> list[str]: ...

    def knows(self, model: str) -> bool: ...


def fallbacks_of(model: KnownModel) -> list[str]:
    """The names ``model`` falls back to, in order: its definition's list, else its catalog entry's."""
    if model.definition is not None and model.definition.fallbacks is not None:
        return list(model.definition.fallbacks)
    return list(model.entry.fallback or []) if model.entry is not None else []


def fallback_problems(
    name: str, fallbacks: Iterable[str], models: ModelRegistry, peers: PeerModels | None = None
) -> list[str]:
    """What is wrong with ``fallbacks`` as the list of the model called ``name``; empty when nothing is."""
    found: list[str] = []
    seen: set[str] = set()
    local: list[str] = []
    for i, item in enumerate(fallbacks):
        field = f"fallbacks[{i}]"
        if not item.strip():
            found.append(f"{field}: empty; name a model of the catalog, or PEER/MODEL for a federation peer's")
        elif item in seen:
            found.append(f"{field}: {item!r} is listed twice")
        elif item == name:
            found.append(f"{field}: a model cannot fall back to itself")
        elif PEER_MARK in item:
            peer = item.partition(PEER_MARK)[0]
            if peers is None or peer not in peers.names():
                found.append(
                    f"{field}: {item!r} names the federation peer {peer!r}, which is not known; "
                    "GET /api/v1/federation lists the peers"
                )
            elif not peers.knows(item):
                found.append(
                    f"{field}: the federation peer {peer!r} does not offer {item!r}; "
                    "GET /api/v1/federation lists its models"
                )
        elif models.active(item) is None:
            found.append(f"{field}: model {item!r} is not in the catalog; GET /api/v1/models lists them")
        else:
            local.append(item)
        seen.add(item)
    cycle = _cycle(name, local, models)
    if cycle:
        found.append(f"fallbacks: {' → '.join(cycle)} would be a cycle; a request would go round it")
    return found


def _cycle(name: str, fallbacks: list[str], models: ModelRegistry) -> list[str]:
    """The path back to ``name`` through the fallback lists, when ``name``'s list were ``fallbacks``; else empty."""

    def next_of(current: str) -> list[str]:
        if current == name:
            return fallbacks
        known = models.active(current)
        return [f for f in fallbacks_of(known) if PEER_MARK not in f] if known is not None else []

    path = [name]
    visited: set[str] = set()

    def walk(current: str) -> bool:
        for following in next_of(current):
            if following == name:
                path.append(name)
                return True
            if following in visited:
                continue
            visited.add(following)
            path.append(following)
            if walk(following):
                return True
            path.pop()
        return False

    return path if walk(name) else []
