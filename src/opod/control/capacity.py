"""Where a model can go and how much it can serve: ``explain-placement``, measured capacity, ``target`` and ``headroom``.

Every answer asks :mod:`opod.fleet.placement` the reconciler's question on the
fleet as it is now: the nodes, and the replicas that hold devices (the
reconciler's, or what workers report loaded where no reconciler runs).
Nothing here changes the fleet: ``target`` and ``headroom`` place replicas in
a :class:`~opod.fleet.placement.Planner` of their own and throw it away.
Capacity measurements are recorded and read through
:class:`~opod.fleet.models_service.ModelsService` (kept in the store only, one
row per model and profile, the newest replacing the one before).
"""

from __future__ import annotations

import math
import time

from fastapi import APIRouter, Depends, Query
from pydantic import ValidationError

from opod.contract.admin.catalog import CatalogModel
from opod.contract.admin.fleet import CapacityView, ExplainView, RejectionView
from opod.contract.admin.models import BenchCapacity, HeadroomView, TargetView
from opod.control.audit import audit_draft
from opod.control.context import ControlError, ReplicaDesk
from opod.control.holding import current, held_now, planner
from opod.control.spec import SpecRouter
from opod.fleet.models import KnownModel, ModelRegistry, definition_of
from opod.fleet.models_service import ModelsService, profile_names
from opod.fleet.placed import Rejection, effective_class
from opod.fleet.placement import place
from opod.fleet.state import Fleet
from opod.store.audit import AuditDraft
from opod.store.capacity import CapacityRecord

HEADROOM_LIMIT, HEADROOM_MAX = 16, 64
TARGET_MOST = 4096
"""The most replicas ``target`` simulates placing: past it a fleet is not sized by this answer."""


def known(models: ModelRegistry, name: str, what: str = "model") -> KnownModel:
    model = models.named(name)
    if model is None:
        raise ControlError(404, f"{what}: {name!r} is not a model's name or alias; GET /api/v1/models lists them")
    return model


def lines(rejections: list[Rejection]) -> list[str]:
    """``n1: gpus: needs 2 free H100, has 1 free``: a line per node considered (with the profile when there are several)."""
    several = len({r.profile for r in rejections}) > 1
    return [f"{r.node}{f' ({r.profile})' if several else ''}: {r.reason}" for r in rejections]


def rejection_view(r: Rejection) -> RejectionView:
    return RejectionView(profile=r.profile, pool=r.pool, node=r.node, reason=r.reason)


# --- measurements -------------------------------------------------------------------------------------


def capacity_views(records: list[CapacityRecord]) -> list[CapacityView]:
    out = []
    for record in records:
        try:
            kept = BenchCapacity.model_validate_json(record.capacity_json)
        except ValidationError:
            kept = BenchCapacity()
        out.append(
            CapacityView(**kept.model_dump(exclude_none=True), measured_by=record.measured_by or None).model_copy(
                update={"model": record.model_id, "profile": record.profile or None, "measured_at": record.measured_at}
            )
        )
    return out


def measurement_for(definition: CatalogModel, measured: list[CapacityView], profile: int | None) -> CapacityView | None:
    """The measurement of the profile placement would use (``profile``), else of the model's first measured profile."""
    names = profile_names(definition)
    by_name = {m.profile or "": m for m in measured}
    if profile is not None and profile < len(names) and names[profile] in by_name:
        return by_name[names[profile]]
    if profile is not None and not names and "" in by_name:
        return by_name[""]
    order = sorted(range(len(names)), key=lambda i: -((definition.profiles or [])[i].priority or 0))
    for i in order:
        if names[i] in by_name:
            return by_name[names[i]]
    return measured[0] if measured else None


# --- the routes -------------------------------------------------------------------------------------


def router(service: ModelsService, models: ModelRegistry, fleet: Fleet, desk: ReplicaDesk) -> APIRouter:
    api = SpecRouter()

    @api.get(
        "/api/v1/explain-placement",
        operation_id="getExplainPlacement",
        tags=["explain-placement"],
        response_model=ExplainView,
    )
    async def get_explain_placement(model: str = Query()) -> ExplainView:
        found = known(models, model)
        placed = current(fleet, desk, found) > 0
        last = desk.last_rejections.get(found.id)
        if last is not None:
            rejections = list(last)
        elif placed:
            rejections = []
        else:
            definition = definition_of(found)
            _, rejections = place(
                found.id,
                definition,
                list(fleet),
                held_now(models, fleet, desk),
                klass=effective_class(definition),
                engine=found.engine,
            )
        return ExplainView(model=found.id, placed=placed, rejections=[rejection_view(r) for r in rejections])

    @api.put(
        "/api/v1/models/{name}/capacity",
        operation_id="putModelsNameCapacity",
        tags=["models"],
        response_model=BenchCapacity,
    )
    async def put_models_name_capacity(
        name: str, body: BenchCapacity, draft: AuditDraft = Depends(audit_draft)
    ) -> BenchCapacity:
        return await service.record_capacity(name, body, draft)

    @api.get("/api/v1/capacity", operation_id="getCapacity", tags=["capacity"], response_model=list[CapacityView])
    async def get_capacity() -> list[CapacityView]:
        return capacity_views(await service.measurements())

    @api.get(
        "/api/v1/models/{name}/target", operation_id="getModelsNameTarget", tags=["models"], response_model=TargetView
    )
    async def get_models_name_target(name: str, tokens_per_sec: float = Query()) -> TargetView:
        if not math.isfinite(tokens_per_sec) or tokens_per_sec <= 0:
            raise ControlError(
                400, f"tokens_per_sec: {tokens_per_sec} is not a throughput; ask for output tokens a second above 0"
            )
        model = known(models, name, "name")
        measured = capacity_views(await service.measurements(model.id))
        if not measured:
            raise ControlError(
                400,
                f"{model.id} has no measured capacity, so the replicas a throughput needs cannot be counted; "
                f"measure one replica and record it with PUT /api/v1/models/{model.id}/capacity first",
            )
        definition = definition_of(model)
        klass = effective_class(definition)
        now = time.monotonic()
        plan, owners = planner(models, fleet, desk, now)
        first, rejections = plan.place(model.id, definition, klass=klass, engine=model.engine)
        chosen = measurement_for(definition, measured, first.profile if first is not None else None)
        assert chosen is not None
        per = chosen.throughput_tok_per_sec or 0.0
        have = current(fleet, desk, model)
        view = TargetView(
            model=model.id,
            tok_per_sec=tokens_per_sec,
            per_replica_tok_per_sec=per,
            profile=chosen.profile or None,
            current=have,
        )
        if per <= 0 or chosen.max_concurrency_at_slo == 0:
            return view.model_copy(
                update={
                    "needed": 0,
                    "more": 0,
                    "room": 0,
                    "fits": False,
                    "blocked": [
                        f"profile {chosen.profile or '(the only one)'} was measured to serve nothing within its SLO "
                        f"(max_concurrency_at_slo 0): no number of its replicas meets a target; measure another profile"
                    ],
                }
            )
        needed = math.ceil(tokens_per_sec / per - 1e-9)
        more = max(0, needed - have)
        room, victims, blocked = 0, set[str](), list[str]()
        assignment = first
        while room < min(more, TARGET_MOST):
            if assignment is None:
                blocked = lines(rejections)
                break
            victims.update(owners.get(v, v) for v in assignment.preempts)
            plan.take(assignment, f"target-{room}", klass)
            room += 1
            assignment, rejections = plan.place(model.id, definition, klass=klass, engine=model.engine)
        if more > TARGET_MOST and not blocked:
            blocked = [f"{more} more replicas asked; only the first {TARGET_MOST} were tried"]
        return view.model_copy(
            update={
                "needed": needed,
                "more": more,
                "room": room,
                "fits": room >= more,
                "blocked": blocked or None,
                "preempts": sorted(victims) or None,
            }
        )

    @api.get(
        "/api/v1/models/{name}/headroom",
        operation_id="getModelsNameHeadroom",
        tags=["models"],
        response_model=HeadroomView,
    )
    async def get_models_name_headroom(name: str, limit: int | None = None) -> HeadroomView:
        if limit is not None and limit < 1:
            raise ControlError(
                400, f"limit: {limit} replicas; ask for at least 1 (16 when left out, and at most {HEADROOM_MAX})"
            )
        cap = HEADROOM_LIMIT if limit is None or limit > HEADROOM_MAX else limit
        model = known(models, name, "name")
        definition = definition_of(model)
        klass = effective_class(definition)
        plan, owners = planner(models, fleet, desk, time.monotonic())
        where: list[list[str]] = []
        blocked: list[str] = []
        first_profile: int | None = None
        while len(where) < cap:
            assignment, rejections = plan.place(model.id, definition, klass=klass, engine=model.engine, preempt=False)
            if assignment is None:
                blocked = lines(rejections)
                break
            first_profile = assignment.profile if first_profile is None else first_profile
            plan.take(assignment, f"headroom-{len(where)}", klass)
            where.append(list(assignment.nodes))
        by_preempting, victims = 0, set[str]()
        while len(where) + by_preempting < cap:
            assignment, _ = plan.place(model.id, definition, klass=klass, engine=model.engine)
            if assignment is None:
                break
            first_profile = assignment.profile if first_profile is None else first_profile
            victims.update(owners.get(v, v) for v in assignment.preempts)
            plan.take(assignment, f"headroom-preempting-{by_preempting}", klass)
            by_preempting += 1
        measured = capacity_views(await service.measurements(model.id))
        chosen = measurement_for(definition, measured, first_profile)
        return HeadroomView(
            model=model.id,
            current=current(fleet, desk, model),
            more=len(where),
            nodes=where or None,
            limited=len(where) >= cap,
            blocked=blocked or None,
            tok_per_sec=(chosen.throughput_tok_per_sec or 0.0) if chosen is not None else 0.0,
            by_preempting=by_preempting,
            preempts=sorted(victims) or None,
        )

    return api
