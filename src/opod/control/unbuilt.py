"""The operations of the management API whose areas are not built yet: one table, each answering 501.

Every operation of the specification is either routed by an area (:mod:`opod.control.areas`) or
listed in :data:`UNBUILT`, with its method, path, operation id, answer and body types, so the
document (``GET /api/v1/openapi.json``) lists it as the spec does and a client sees it exist. Each
answers 501 with an ``ErrorView`` naming its area. Building an area deletes its rows here;
``tests/control/test_unbuilt.py`` fails when an operation of the spec is in neither place, or in both.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Query

from opod.contract.admin.common import JudgeView
from opod.contract.admin.hardware import (
    FabricsReport,
    FabricTestRequest,
    FabricTestView,
    FacilityView,
    HoldRequest,
    HoldView,
    NvlinkReport,
    TopologyView,
)
from opod.contract.admin.services import (
    JudgeAskRequest,
    JudgeAskView,
    KBCollectionView,
    KBCreateRequest,
    KBDatasetLine,
    KBDatasetRequest,
    KBDefaultRequest,
    KBDefaultView,
    KBDocumentView,
    KBGrantRequest,
    KBGrantView,
    KBHitView,
    KBSearchRequest,
    KBView,
    TrainJobView,
    TrainPublishView,
    TrainRequest,
)
from opod.control.context import ControlError
from opod.control.spec import SpecRouter


@dataclass(frozen=True, slots=True)
class Unbuilt:
    """One operation of the spec that answers 501 until its area is built."""

    area: str
    """The area's name in the 501's words (``the management API's guard judges``)."""
    method: str
    path: str
    operation_id: str
    answer: Any
    """The answer's type, as the spec names it (the document shows it)."""
    tag: str
    body: Any = None
    """The body's type (``T | None`` where the spec's body is optional); None for none."""
    query: tuple[tuple[str, Any], ...] = ()
    """Query parameters and their types; a type without ``None`` is required."""
    status: int | None = None
    """The success status the spec gives, when not 200."""


UNBUILT: tuple[Unbuilt, ...] = (
    Unbuilt("guard judges", "GET", "/api/v1/guard/judges", "getGuardJudges", list[JudgeView], tag="guard"),
    Unbuilt(
        "guard judges",
        "POST",
        "/api/v1/guard/judges/ask",
        "postGuardJudgesAsk",
        JudgeAskView,
        tag="guard",
        body=JudgeAskRequest,
    ),
    Unbuilt("knowledge bases", "GET", "/api/v1/kb", "getKb", KBView, tag="kb"),
    Unbuilt(
        "knowledge bases",
        "POST",
        "/api/v1/kb/collections",
        "postKbCollections",
        KBCollectionView,
        tag="kb",
        body=KBCreateRequest,
        status=201,
    ),
    Unbuilt(
        "knowledge bases", "DELETE", "/api/v1/kb/collections/{id}", "deleteKbCollectionsId", dict[str, Any], tag="kb"
    ),
    Unbuilt(
        "knowledge bases",
        "POST",
        "/api/v1/kb/collections/{id}/dataset",
        "postKbCollectionsIdDataset",
        KBDatasetLine,
        tag="kb",
        body=KBDatasetRequest,
    ),
    Unbuilt(
        "knowledge bases",
        "GET",
        "/api/v1/kb/collections/{id}/documents",
        "getKbCollectionsIdDocuments",
        list[KBDocumentView],
        tag="kb",
    ),
    Unbuilt(
        "knowledge bases",
        "DELETE",
        "/api/v1/kb/collections/{id}/documents",
        "deleteKbCollectionsIdDocuments",
        dict[str, Any],
        tag="kb",
        query=(("name", str),),
    ),
    Unbuilt(
        "knowledge bases",
        "POST",
        "/api/v1/kb/defaults",
        "postKbDefaults",
        KBDefaultView,
        tag="kb",
        body=KBDefaultRequest,
    ),
    Unbuilt("knowledge bases", "POST", "/api/v1/kb/grants", "postKbGrants", KBGrantView, tag="kb", body=KBGrantRequest),
    Unbuilt(
        "knowledge bases", "DELETE", "/api/v1/kb/grants", "deleteKbGrants", KBGrantView, tag="kb", body=KBGrantRequest
    ),
    Unbuilt(
        "knowledge bases", "POST", "/api/v1/kb/search", "postKbSearch", list[KBHitView], tag="kb", body=KBSearchRequest
    ),
    Unbuilt(
        "training",
        "POST",
        "/api/v1/train/jobs",
        "postTrainJobs",
        TrainJobView,
        tag="train",
        body=TrainRequest,
        status=201,
    ),
    Unbuilt(
        "training",
        "GET",
        "/api/v1/train/jobs",
        "getTrainJobs",
        list[TrainJobView],
        tag="train",
        query=(("limit", int | None),),
    ),
    Unbuilt("training", "GET", "/api/v1/train/jobs/{id}", "getTrainJobsId", TrainJobView, tag="train"),
    Unbuilt("training", "DELETE", "/api/v1/train/jobs/{id}", "deleteTrainJobsId", dict[str, Any], tag="train"),
    Unbuilt(
        "training",
        "GET",
        "/api/v1/train/jobs/{id}/artifacts/{kind}",
        "getTrainJobsIdArtifactsKind",
        dict[str, Any],
        tag="train",
    ),
    Unbuilt("training", "POST", "/api/v1/train/jobs/{id}/cancel", "postTrainJobsIdCancel", TrainJobView, tag="train"),
    Unbuilt(
        "training", "POST", "/api/v1/train/jobs/{id}/publish", "postTrainJobsIdPublish", TrainPublishView, tag="train"
    ),
    Unbuilt(
        "fabrics",
        "POST",
        "/api/v1/fabric-test",
        "postFabricTest",
        FabricTestView,
        tag="fabric-test",
        body=FabricTestRequest,
    ),
    Unbuilt("fabrics", "GET", "/api/v1/fabrics", "getFabrics", FabricsReport, tag="fabrics"),
    Unbuilt("fabrics", "GET", "/api/v1/fabrics/{id}/topology", "getFabricsIdTopology", TopologyView, tag="fabrics"),
    Unbuilt("facility power", "GET", "/api/v1/facility", "getFacility", FacilityView, tag="facility"),
    Unbuilt(
        "facility power",
        "POST",
        "/api/v1/facility/holds",
        "postFacilityHolds",
        HoldView,
        tag="facility",
        body=HoldRequest,
    ),
    Unbuilt(
        "facility power",
        "DELETE",
        "/api/v1/facility/holds/{domain}",
        "deleteFacilityHoldsDomain",
        HoldView,
        tag="facility",
    ),
    Unbuilt("NVLink", "GET", "/api/v1/nvlink", "getNvlink", NvlinkReport, tag="nvlink"),
)


def not_built(area: str) -> ControlError:
    return ControlError(
        501,
        f"this opod does not have the management API's {area} yet; the operation is in the document so clients "
        "can see it",
    )


def _endpoint(op: Unbuilt) -> Callable[..., Any]:
    """A handler whose signature declares the operation's path, query and body parameters (the document reads it)."""

    async def endpoint(**_: Any) -> Any:
        raise not_built(op.area)

    params = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)
        for name in re.findall(r"{(\w+)}", op.path)
    ]
    for name, kind in op.query:
        optional = type(None) in getattr(kind, "__args__", ())
        default = None if optional else Query()
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind))
    if op.body is not None:
        optional = type(None) in getattr(op.body, "__args__", ())
        params.append(
            inspect.Parameter(
                "body",
                inspect.Parameter.KEYWORD_ONLY,
                default=None if optional else inspect.Parameter.empty,
                annotation=op.body,
            )
        )
    endpoint.__signature__ = inspect.Signature(params, return_annotation=op.answer)  # type: ignore[attr-defined]
    endpoint.__name__ = re.sub(r"(?<!^)(?=[A-Z])", "_", op.operation_id).lower()  # the document's summary
    return endpoint


def router() -> APIRouter:
    """Every row of :data:`UNBUILT`, routed."""
    api = SpecRouter()
    for op in UNBUILT:
        api.add_api_route(
            op.path,
            _endpoint(op),
            methods=[op.method],
            operation_id=op.operation_id,
            tags=[op.tag],
            response_model=op.answer,
            **({"status_code": op.status} if op.status is not None else {}),
        )
    return api
