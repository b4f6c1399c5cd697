"""The models this leader knows, in memory: added ones and what is wanted where.

The gateway asks it whether a name is a model at all (404) or a model with no
worker ready (503); the control plane and the reconciler change it together
with the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opod.contract.admin.catalog import CatalogModel
from opod.contract.catalog import Entry

ANY_NODE = "*"


@dataclass(slots=True)
class ModelStatus:
    """What the reconciler last made of a model with a definition: ``ModelView``'s replica counts, parking, preemption."""

    desired: int = 0
    ready: int = 0
    total: int = 0
    """Replicas starting, ready or draining."""
    failures: int = 0
    """Failed starts in a row."""
    parked: bool = False
    reason: str = ""
    """Why it is parked, or why the last start failed."""
    unplaceable: bool = False
    """Short of replicas and no node can take one now (``explain-placement`` says why)."""
    preempted: int = 0
    """Replicas of it stopped to make room for a higher class."""
    held_for: str = ""
    """The model its preempted replicas gave room to, while it waits for room again."""


@dataclass(slots=True)
class KnownModel:
    id: str
    entry: Entry | None = None
    """The catalog entry (bundled, or written for a model added by path or repo)."""
    engine: str = ""
    wanted: dict[str, str] = field(default_factory=dict)
    """node id (or ``*``) → ``loaded`` | ``unloaded``."""
    removed: bool = False
    """Removed from the store; kept here only until no worker holds it."""
    definition: CatalogModel | None = None
    """The model as the management API's catalog has it (profiles, scaling, class, owner, aliases, ...)."""
    status: ModelStatus = field(default_factory=ModelStatus)
    """Kept by the reconciler for models with a definition; read by the model views."""

    @property
    def capabilities(self) -> list[str]:
        return list(self.entry.capabilities) if self.entry is not None else ["chat"]

    @property
    def stated_capabilities(self) -> frozenset[str] | None:
        """The entry's capabilities as the request rules read them; ``None`` (unknown: nothing refused) when it lists none."""
        if self.entry is None or not self.entry.capabilities:
            return None
        return frozenset(self.entry.capabilities)

    @property
    def context_length(self) -> int | None:
        """Tokens one request may use, as the catalog states it; ``None`` when unknown."""
        return self.entry.context_window if self.entry is not None and self.entry.context_window > 0 else None

    def wants_loaded(self) -> bool:
        return any(state == "loaded" for state in self.wanted.values())


def definition_of(model: KnownModel) -> CatalogModel:
    """The model's definition; one that names only the model when it has none."""
    return model.definition if model.definition is not None else CatalogModel(name=model.id)


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, KnownModel] = {}
        self.get: Callable[[str], KnownModel | None] = self._models.get
        """The model with this id, removed or not: the dict's own ``get``, asked on every request's way."""

    def put(self, model: KnownModel) -> None:
        self._models[model.id] = model

    def active(self, model_id: str) -> KnownModel | None:
        """The model unless it was removed."""
        model = self._models.get(model_id)
        return None if model is None or model.removed else model

    def named(self, name: str) -> KnownModel | None:
        """The active model called ``name``, by its own name or one of its definition's aliases."""
        model = self._models.get(name)
        if model is not None and not model.removed:
            return model
        for candidate in self._models.values():
            if (
                not candidate.removed
                and candidate.definition is not None
                and name in (candidate.definition.aliases or ())
            ):
                return candidate
        return None

    def remove(self, model_id: str) -> None:
        self._models.pop(model_id, None)

    def ids(self) -> list[str]:
        return sorted(m for m, model in self._models.items() if not model.removed)

    def __iter__(self) -> Iterator[KnownModel]:
        return iter(self._models[i] for i in sorted(self._models))

    def default_for(self, capability: str) -> str | None:
        """The first wanted model with ``capability``: what ``model: "auto"`` means."""
        for model in self:
            if not model.removed and model.wants_loaded() and capability in model.capabilities:
                return model.id
        return None
