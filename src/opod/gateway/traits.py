"""What the request rules need to know of a model (:class:`opod.gateway.validate.ModelTraits`), kept per model.

Its context and capabilities come from the catalog, the engines serving it from the fleet's live workers; a
worker's engine may have been started with less than the catalog's window, and then the smaller is the limit.
"""

from __future__ import annotations

from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.gateway.validate import ModelTraits


def model_traits(model: str, known: KnownModel | None, live: list[NodeState], served: int | None) -> ModelTraits:
    """The traits made from the catalog's model (``None``: not in it), its live workers and their context."""
    engines = frozenset(n.engine_id for n in live if n.engine_id)
    if known is None:
        return ModelTraits(model, context=served, engines=engines)
    if not engines and known.engine:
        engines = frozenset((known.engine,))
    stated = known.context_length
    context = min(stated, served) if stated and served else stated or served
    entry = known.entry
    return ModelTraits(
        model,
        context=context,
        capabilities=known.stated_capabilities,
        engines=engines,
        dimensions=entry.embedding_dimensions or None if entry is not None else None,
        matryoshka=entry is not None and entry.matryoshka,
    )


class TraitsBook:
    """Each model's traits, made again only when what they are made of is another object."""

    def __init__(self, models: ModelRegistry, fleet: Fleet) -> None:
        self.models = models
        self.fleet = fleet
        self.kept: dict[str, tuple[KnownModel, object, str, list[NodeState], ModelTraits]] = {}
        """Only models in the catalog, so a client's names cannot grow it."""

    def of(self, model: str) -> ModelTraits:
        """``model``'s traits. Made again only when the catalog's model, its entry or engine, or the fleet's list of
        live workers for it is another object: the fleet makes that list anew at least every ``LIVE_CACHE`` seconds,
        so a context a worker reports anew is in force within that."""
        known = self.models.active(model)
        if known is None and ":" in model:
            known = self.models.active(model.partition(":")[0])  # an adapter: its base model's traits
        live = self.fleet.workers_for(model)
        if known is None:
            return model_traits(model, None, live, self.fleet.served_context(model))
        kept = self.kept.get(model)
        if (
            kept is not None
            and kept[0] is known
            and kept[1] is known.entry
            and kept[2] == known.engine
            and kept[3] is live
        ):
            return kept[4]
        traits = model_traits(model, known, live, self.fleet.served_context(model))
        self.kept[model] = (known, known.entry, known.engine, live, traits)
        return traits
