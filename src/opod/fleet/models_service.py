"""The one writer of the cluster's models: definitions, their scaling, class, owner and resources, opod's pins, and
what one replica was measured to serve.

The management API and the leader's loops change models only through :class:`ModelsService`.
A definition is checked whole before anything is written (:mod:`opod.catalog.definition`), and
its owners are resolved in the tenancy tree and kept as ``kind:ID``, so a scope renamed later still
owns its models and an owner that names nothing is refused. Each change is written to the store
first, in one transaction with its audit row, then to the registry, then the reconciler is woken;
a refusal leaves store and memory as they were, and its audit row to the listener.

A model with replicas wanted is wanted ``loaded`` on any worker: adding one with ``scaling.min`` 0
(or scaling it to 0) leaves it unloaded. :meth:`ModelsService.pin` (opod's ``load`` and ``unload``)
pins it to a node, or changes its scaling when no node is named.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Collection
from datetime import UTC, datetime

from opod.catalog import Catalog
from opod.catalog.definition import (
    DefinitionError,
    class_problem,
    derived_name,
    entry_for,
    owner_problem,
    problems,
    scaling_in_force,
    with_defaults,
)
from opod.contract.admin.catalog import (
    CatalogAdapter,
    CatalogCanary,
    CatalogEvalGate,
    CatalogModel,
    CatalogOrigin,
    CatalogProfile,
    CatalogScaling,
)
from opod.contract.admin.models import BenchCapacity
from opod.engines.registry import DRIVERS
from opod.fleet.asks import profile_label
from opod.fleet.fallbacks import PeerModels, fallback_problems
from opod.fleet.followers import Reconciling
from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry, definition_of
from opod.fleet.scopes import ScopeTree
from opod.fleet.state import Fleet
from opod.store import Store, Wanted
from opod.store.audit import AuditDraft
from opod.store.capacity import CapacityRecord
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.offloop import run_sync

log = logging.getLogger("opod.fleet")

ENGINES = frozenset(name for d in DRIVERS for name in (d.id, *d.aliases))
"""Engine names a profile may give: every driver's id and aliases."""

OWNER_KINDS = ("org", "team", "project")
"""What a model's capacity may count against (``catalog.Model.owner``)."""
ADAPTER_OWNER_KINDS = ("org", "team", "project", "user", "key")
"""Who an adapter may belong to (``catalog.Adapter.owner``)."""

MEASURED = (
    "max_concurrency_at_slo",
    "throughput_tok_per_sec",
    "ttft_p99",
    "tpot_p99",
    "suggested_target_waiting",
    "suggested_kv_ceiling",
)
"""The numbers of a capacity measurement, each at least 0."""


def dump(definition: CatalogModel) -> str:
    return definition.model_dump_json(exclude_none=True, by_alias=True)


def single_engine(definition: CatalogModel) -> str:
    """The engine every profile names, when they name one: workers running another are not chosen."""
    engines = {(p.engine or "").strip().lower() for p in definition.profiles or []}
    return engines.pop() if len(engines) == 1 else ""


def wanted_for(definition: CatalogModel) -> Wanted | None:
    """What is wanted on any worker: loaded while it should have replicas, else unloaded; nothing for an external model."""
    if definition.external is not None:
        return None
    return "loaded" if scaling_in_force(definition)[0] > 0 else "unloaded"


def profile_names(definition: CatalogModel) -> list[str]:
    """Each profile's name as measurements and placement's answers name it."""
    return [profile_label(p, i) for i, p in enumerate(definition.profiles or [])]


def _refuse(found: list[str]) -> None:
    if found:
        raise InvalidInput("; ".join(found))


class ModelsService:
    """Writes models to the store with their audit rows, then to the registry, then wakes the reconciler."""

    def __init__(
        self,
        store: Store,
        models: ModelRegistry,
        catalog: Catalog,
        fleet: Fleet,
        reconciler: Reconciling,
        scopes: ScopeTree,
        *,
        declared: frozenset[str],
        peers: PeerModels | None = None,
    ) -> None:
        """``declared``: the models the leader's settings declare (the built-in defaults), which are never removed;
        ``peers``: the federation's, whose models a fallback may name as PEER/MODEL (none: no fallback may)."""
        self.store = store
        self.models = models
        self.catalog = catalog
        self.fleet = fleet
        self.reconciler = reconciler
        self.scopes = scopes
        self.declared = declared
        self.peers = peers

    # --- reading ---------------------------------------------------------------------------------------

    def named(self, name: str) -> KnownModel:
        """The model called ``name`` (or by an alias); ``NotFound`` when there is none."""
        model = self.models.named(name)
        if model is None:
            raise NotFound(
                f"model {name!r} is not in the catalog; GET /api/v1/models lists them, POST /api/v1/models adds one"
            )
        return model

    async def measurements(self, model_id: str | None = None) -> list[CapacityRecord]:
        """The capacity measurements kept, of every model or of ``model_id``."""
        return await run_sync(self.store.list_capacity, model_id)

    # --- owners -------------------------------------------------------------------------------------------

    def _owner(self, text: str, kinds: Collection[str], field: str) -> str:
        return self.scopes.scope(text, kinds=kinds, field=field)

    def _owned(self, definition: CatalogModel, before: CatalogModel | None = None) -> CatalogModel:
        """``definition`` with each owner it changes from ``before`` as ``kind:ID``.

        Raises ``InvalidInput`` (not a scope of a kind taken there) or ``NotFound`` (no such scope), naming the field.
        An owner left as it was is kept as it is: a model whose owner was removed from the tree can still be scaled.
        """
        update: dict[str, object] = {}
        if definition.owner and (before is None or definition.owner != before.owner):
            update["owner"] = self._owner(definition.owner, OWNER_KINDS, "owner")
        kept = {a.name: a.owner for a in (before.adapters or [])} if before is not None else {}
        adapters: list[CatalogAdapter] = []
        for i, adapter in enumerate(definition.adapters or []):
            if adapter.owner and (adapter.name not in kept or kept[adapter.name] != adapter.owner):
                owner = self._owner(adapter.owner, ADAPTER_OWNER_KINDS, f"adapters[{i}].owner")
                adapter = adapter.model_copy(update={"owner": owner})
            adapters.append(adapter)
        if definition.adapters is not None:
            update["adapters"] = adapters
        return definition.model_copy(update=update) if update else definition

    def resolve_stored_owners(self) -> list[str]:
        """Keep the owners stored as names (``team:acme/ml``) as ``kind:ID`` wherever the scope exists (at start,
        off the loop); the models changed.

        An owner that names no scope now is left as it was: it counts against nobody until somebody sets another.
        """
        changed = []
        for model in self.models:
            if model.removed or model.definition is None:
                continue
            resolved = self._resolved_where_known(model.definition)
            if resolved == model.definition:
                continue
            self.store.set_definition(model.id, dump(resolved))
            model.definition = resolved
            changed.append(model.id)
            log.info("model %s: its owners are kept by ID from now on (%s)", model.id, resolved.owner or "shared")
        return changed

    def _resolved_where_known(self, definition: CatalogModel) -> CatalogModel:
        def known(text: str | None, kinds: Collection[str], field: str) -> str | None:
            if not text:
                return text
            try:
                return self._owner(text, kinds, field)
            except (InvalidInput, NotFound):
                return text

        adapters = [
            a.model_copy(update={"owner": known(a.owner, ADAPTER_OWNER_KINDS, f"adapters[{i}].owner")})
            for i, a in enumerate(definition.adapters or [])
        ]
        return definition.model_copy(
            update={
                "owner": known(definition.owner, OWNER_KINDS, "owner"),
                **({"adapters": adapters} if definition.adapters is not None else {}),
            }
        )

    # --- adding and removing ---------------------------------------------------------------------------

    async def add(self, definition: CatalogModel, audit: AuditDraft, *, preset_by: str | None = None) -> KnownModel:
        """Check a whole definition, then keep it: the store in one transaction with its audit row, then memory.

        ``preset_by`` records it as a preset that actor added (``auto``: the leader). Raises ``InvalidInput``,
        ``NotFound`` (an owner that names nothing) or ``Conflict`` (a name or alias taken).
        """
        if not definition.name and definition.source:
            definition = definition.model_copy(update={"name": derived_name(definition.source)})
        _refuse(problems(definition, ENGINES))
        definition = self._owned(definition)
        name = definition.name or ""
        if self.models.active(name) is not None:
            raise Conflict(
                f"name: model {name!r} is already in the catalog; change it (scale, resources, class, owner) "
                "or remove it first, or choose another name"
            )
        self._name_conflicts(definition)
        _refuse(fallback_problems(name, definition.fallbacks or [], self.models, self.peers))
        try:
            entry, bundled = entry_for(definition, self.catalog.get(name))
        except DefinitionError as err:
            close = (
                difflib.get_close_matches(name, self.catalog.ids(), n=3, cutoff=0.5) if not definition.source else []
            )
            raise InvalidInput(str(err) + (f". Did you mean {', '.join(close)}?" if close else "")) from None
        engine = single_engine(definition)
        wanted = "loaded" if wanted_for(definition) == "loaded" else None  # added without replicas: placed nowhere yet
        with audit.commit(target=f"model:{name}") as row:
            await run_sync(
                self.store.add_model,
                name,
                source_json=entry.source.to_json() if entry is not None else "{}",
                entry_json=None if bundled or entry is None else entry.to_json(),
                engine=engine,
                definition_json=dump(definition),
                wanted=wanted,
                preset_by=preset_by,
                audit=row,
            )
        model = KnownModel(id=name, entry=entry, engine=engine, definition=definition)
        if wanted is not None:
            model.wanted[ANY_NODE] = wanted
        self.models.put(model)
        self.reconciler.kick()
        return model

    def _name_conflicts(self, definition: CatalogModel) -> None:
        """``Conflict`` when the name or an alias is another model's name or alias."""
        names = [definition.name or "", *(definition.aliases or [])]
        for other in self.models:
            if other.removed:
                continue
            theirs = {other.id, *(definition_of(other).aliases or [])}
            for i, name in enumerate(names):
                if name in theirs:
                    field = "name" if i == 0 else f"aliases[{i - 1}]"
                    raise Conflict(
                        f"{field}: {name!r} is already a name of model {other.id!r}; choose another, "
                        f"or remove {other.id!r} first"
                    )

    async def remove(self, name: str, audit: AuditDraft) -> KnownModel:
        """Take a model out of the catalog (a preset it came from is declined); its replicas stop.

        ``Conflict`` for a model the leader's settings declare: it can be scaled to 0, never removed.
        """
        model = self.named(name)
        if model.id in self.declared:
            raise Conflict(
                f"{model.id!r} is the leader's built-in default model, declared by its settings, so it stays in the "
                f"catalog; to stop serving it, scale it to 0 (POST /api/v1/models/{model.id}/scale "
                '{"min": 0}), or start the leader with --no-default-models'
            )
        with audit.commit(target=f"model:{model.id}") as row:
            await run_sync(self.store.remove_model, model.id, audit=row)
        model.wanted = {ANY_NODE: "unloaded"}
        model.removed = True
        self.reconciler.kick()
        return model

    # --- changing a definition -------------------------------------------------------------------------

    async def _redefine(
        self,
        model: KnownModel,
        definition: CatalogModel,
        audit: AuditDraft,
        *,
        rescale: bool = False,
        weights: bool = False,
    ) -> KnownModel:
        """Replace a model's definition after checking it whole; with ``rescale``, what is wanted on any worker
        follows its scaling; with ``weights``, the entry workers fetch by follows its source and origin."""
        _refuse(problems(definition, ENGINES))
        definition = self._owned(definition, definition_of(model))
        wanted = wanted_for(definition) if rescale else None
        engine = single_engine(definition)
        entry, bundled = model.entry, False
        if weights:
            try:
                entry, bundled = entry_for(definition, self.catalog.get(model.id))
            except DefinitionError as err:
                raise InvalidInput(str(err)) from None
        entry_json = entry.to_json() if weights and entry is not None and not bundled else None
        with audit.commit(target=f"model:{model.id}") as row:
            await run_sync(
                self.store.set_definition,
                model.id,
                dump(definition),
                entry_json=entry_json,
                engine=engine,
                wanted=wanted,
                audit=row,
            )
        model.definition = definition
        model.entry = entry
        model.engine = engine
        if wanted == "unloaded":
            model.wanted = dict.fromkeys({ANY_NODE, *model.wanted}, "unloaded")
        elif wanted is not None:
            model.wanted[ANY_NODE] = wanted
        self.reconciler.kick()
        return model

    async def set_fallbacks(self, name: str, fallbacks: list[str], audit: AuditDraft) -> KnownModel:
        """Replace the models it falls back to; an empty list takes them all away.

        ``Conflict`` for a model the API did not add (its catalog entry's ``fallback`` is its list);
        ``InvalidInput`` naming each item that is wrong, nothing changed."""
        model = self.named(name)
        if model.definition is None:
            raise Conflict(
                f"{model.id!r} comes from the catalog file, not the management API, so its fallbacks are its "
                "catalog entry's 'fallback' list; add a model with POST /api/v1/models to set them here"
            )
        _refuse(fallback_problems(model.id, fallbacks, self.models, self.peers))
        update = {"fallbacks": list(fallbacks) or None}
        return await self._redefine(model, definition_of(model).model_copy(update=update), audit)

    async def set_adapters(self, name: str, adapters: list[CatalogAdapter], audit: AuditDraft) -> KnownModel:
        """Replace its LoRA adapters whole (an empty list takes them all away); the adapters' service reads their
        files on the workers first (:class:`opod.fleet.adapters_service.AdaptersService`)."""
        model = self.named(name)
        update = {"adapters": list(adapters) or None}
        return await self._redefine(model, definition_of(model).model_copy(update=update), audit)

    async def set_canary(self, name: str, canary: CatalogCanary | None, audit: AuditDraft) -> KnownModel:
        """Replace its canary (``None`` takes it away); the canaries' service checks it first
        (:class:`opod.fleet.canaries_service.CanariesService`)."""
        model = self.named(name)
        return await self._redefine(model, definition_of(model).model_copy(update={"canary": canary}), audit)

    async def take_weights(self, name: str, donor: CatalogModel, audit: AuditDraft) -> KnownModel:
        """Give the model ``donor``'s weights (its source, profiles and origin) and take its canary away: a promoted
        candidate's weights become the model's, and its replicas are replaced (the reconciler rolls them)."""
        model = self.named(name)
        update = {"source": donor.source, "profiles": donor.profiles, "origin": donor.origin, "canary": None}
        return await self._redefine(model, definition_of(model).model_copy(update=update), audit, weights=True)

    async def move_weights(self, name: str, source: str, origin: CatalogOrigin, audit: AuditDraft) -> KnownModel:
        """Give the model other weights of its repository (an update's, a rollback's), everything else kept, its canary
        too: the caller replaces its replicas while the canary carries its requests."""
        model = self.named(name)
        update = {"source": source, "origin": origin}
        return await self._redefine(model, definition_of(model).model_copy(update=update), audit, weights=True)

    async def set_origin(self, name: str, origin: CatalogOrigin, audit: AuditDraft) -> KnownModel:
        """Record where the model's weights were published (weights added by hand), so updates can be looked for."""
        model = self.named(name)
        return await self._redefine(model, definition_of(model).model_copy(update={"origin": origin}), audit)

    async def scale(
        self, name: str, audit: AuditDraft, *, low: int | None, high: int | None, idle_timeout: int | None
    ) -> KnownModel:
        """Set how many replicas it runs: ``low`` left out keeps the minimum in force, ``high`` left out follows it,
        ``idle_timeout`` left out keeps the one set."""
        model = self.named(name)
        current = definition_of(model)
        scaling = (current.scaling or CatalogScaling()).model_copy(
            update={
                "min": low if low is not None else scaling_in_force(current)[0],
                "max": high,
                "idle_timeout": idle_timeout
                if idle_timeout is not None
                else (current.scaling.idle_timeout if current.scaling else None),
            }
        )
        return await self._redefine(model, current.model_copy(update={"scaling": scaling}), audit, rescale=True)

    async def set_class(self, name: str, klass: str, audit: AuditDraft) -> KnownModel:
        """Set its capacity class; ``""`` goes back to what its scaling implies."""
        model = self.named(name)
        _refuse([p for p in [class_problem(klass)] if p])
        return await self._redefine(model, definition_of(model).model_copy(update={"class_": klass or None}), audit)

    async def set_owner(self, name: str, owner: str, audit: AuditDraft) -> KnownModel:
        """Set the scope its capacity counts against, kept as ``kind:ID``; ``""`` makes it shared."""
        model = self.named(name)
        _refuse([p for p in [owner_problem(owner)] if p])
        return await self._redefine(model, definition_of(model).model_copy(update={"owner": owner or None}), audit)

    async def set_eval_gate(self, name: str, gate: CatalogEvalGate | None, audit: AuditDraft) -> KnownModel:
        """Set the quality suite its updates and promotions must pass (checked by ``opod.control.evals``); ``None``
        takes it away."""
        model = self.named(name)
        return await self._redefine(model, definition_of(model).model_copy(update={"eval": gate}), audit)

    async def set_resources(
        self, name: str, audit: AuditDraft, *, profile: str, memory_gb: int | None, cpu_cores: int | None
    ) -> KnownModel:
        """Set what its profiles (``profile``: one of them; ``""``: every one) reserve of a node."""
        model = self.named(name)
        for field, value in (("memory_gb", memory_gb), ("cpu_cores", cpu_cores)):
            if value is not None and value < 0:
                raise InvalidInput(f"{field}: {value} cannot be negative (0 reserves nothing)")
        definition = definition_of(model)
        entry_engine = model.engine or (model.entry.recommended_engines[0] if model.entry is not None else "")
        profiles = list(definition.profiles or []) or [CatalogProfile(engine=entry_engine or None)]
        filled = with_defaults(definition.model_copy(update={"profiles": profiles}), None).profiles or []
        names = [p.name for p in filled]
        if profile and profile not in names:
            raise NotFound(
                f"profile: {profile!r} is not a profile of {definition.name!r}; it has {', '.join(map(str, names))}"
            )
        changed: list[CatalogProfile] = []
        for each, each_name in zip(profiles, names, strict=True):
            if not profile or profile == each_name:
                update: dict[str, object] = {"name": each_name}
                if memory_gb is not None:
                    update["min_memory_gb"] = memory_gb
                if cpu_cores is not None:
                    update["cpu_cores"] = cpu_cores
                each = each.model_copy(update=update)
            changed.append(each)
        return await self._redefine(model, definition.model_copy(update={"profiles": changed}), audit)

    # --- opod's pins --------------------------------------------------------------------------------------

    async def pin(self, name: str, node: str, wanted: Wanted, audit: AuditDraft) -> KnownModel:
        """Want the model ``loaded`` or ``unloaded`` on ``node``; on ``*`` (any node) that is its scaling: unloaded is
        no replicas (min 0), loaded at least one."""
        model = self.named(name)
        if node != ANY_NODE and self.fleet.get(node) is None:
            raise NotFound(f"node {node!r} is not known; `opod node ls` lists them")
        if node == ANY_NODE:
            current = definition_of(model)
            scaling = current.scaling or CatalogScaling()
            low, high, _, _ = scaling_in_force(current)
            if wanted == "unloaded" and (low or high):
                scaling = scaling.model_copy(update={"min": 0, "max": None, "schedule": None})
            elif wanted == "loaded" and not low:
                scaling = scaling.model_copy(update={"min": 1, "max": high if high >= 1 else None})
            return await self._redefine(model, current.model_copy(update={"scaling": scaling}), audit, rescale=True)
        with audit.commit(target=f"model:{model.id}", detail={"node": node, "wanted": wanted}) as row:
            await run_sync(self.store.set_placement, model.id, node, wanted, audit=row)
        model.wanted[node] = wanted
        self.reconciler.kick()
        return model

    # --- capacity measurements --------------------------------------------------------------------------

    async def record_capacity(self, name: str, measured: BenchCapacity, audit: AuditDraft) -> BenchCapacity:
        """Keep what one replica of a profile was measured to serve, replacing the profile's last measurement;
        answered as kept (its model and profile named as the catalog names them, its time set)."""
        model = self.models.named(name)
        if model is None:
            raise NotFound(f"name: {name!r} is not a model's name or alias; GET /api/v1/models lists them")
        kept = self._checked_capacity(model, name, measured)
        with audit.commit(target=f"model:{model.id}") as row:
            await run_sync(
                self.store.put_capacity,
                model.id,
                kept.profile or "",
                kept.model_dump_json(exclude_none=True, by_alias=True),
                measured_by=audit.actor,
                at=kept.measured_at,
                audit=row,
            )
        return kept

    @staticmethod
    def _checked_capacity(model: KnownModel, name: str, body: BenchCapacity) -> BenchCapacity:
        definition = definition_of(model)
        if body.model and body.model != model.id and body.model not in (definition.aliases or []):
            raise InvalidInput(
                f"model: the body names {body.model!r} but the path names {name!r}; leave it out or make them agree"
            )
        names = profile_names(definition)
        profile = body.profile or ""
        if profile and profile not in names:
            known_names = ", ".join(names) or "none (the model has one unnamed profile: leave profile out)"
            raise InvalidInput(f"profile: {model.id} has no profile {profile!r}; its profiles are {known_names}")
        if not profile and len(names) > 1:
            raise InvalidInput(
                f"profile: {model.id} has {len(names)} profiles ({', '.join(names)}); say which one was measured"
            )
        if not profile and len(names) == 1:
            profile = names[0]
        for field in MEASURED:
            value = getattr(body, field)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise InvalidInput(f"{field}: {value} is not a measurement; it must be a number of at least 0")
        if body.suggested_kv_ceiling is not None and body.suggested_kv_ceiling > 1:
            raise InvalidInput(
                f"suggested_kv_ceiling: {body.suggested_kv_ceiling} is a share of the KV cache, from 0 to 1"
            )
        if body.throughput_tok_per_sec is None:
            raise InvalidInput(
                "throughput_tok_per_sec: a measurement needs the output tokens a second one replica served at its SLO"
            )
        at = body.measured_at or datetime.now(UTC)
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return body.model_copy(update={"model": model.id, "profile": profile or None, "measured_at": at})
