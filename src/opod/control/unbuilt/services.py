"""Guardrails, knowledge bases, training and federation: routed to the spec's letter, each answering 501 until its area is built."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from opod.contract.admin.common import JudgeView, Removed
from opod.contract.admin.services import (
    FederationAddRequest,
    FederationStatus,
    FederationView,
    GuardAttachment,
    GuardAttachmentRequest,
    GuardEventsView,
    GuardView,
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
from opod.control.spec import SpecRouter
from opod.control.unbuilt.base import not_built


def router() -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/federation", operation_id="getFederation", tags=["federation"], response_model=FederationView)
    async def get_federation() -> FederationView:
        raise not_built("federation")

    @api.post(
        "/api/v1/federation",
        operation_id="postFederation",
        tags=["federation"],
        response_model=FederationStatus,
        status_code=201,
    )
    async def post_federation(body: FederationAddRequest) -> FederationStatus:
        raise not_built("federation")

    @api.delete(
        "/api/v1/federation/{peer}", operation_id="deleteFederationPeer", tags=["federation"], response_model=Removed
    )
    async def delete_federation_peer(peer: str) -> Removed:
        raise not_built("federation")

    @api.post(
        "/api/v1/federation/{peer}/sync",
        operation_id="postFederationPeerSync",
        tags=["federation"],
        response_model=FederationStatus,
    )
    async def post_federation_peer_sync(peer: str) -> FederationStatus:
        raise not_built("federation")

    @api.get("/api/v1/guard", operation_id="getGuard", tags=["guard"], response_model=GuardView)
    async def get_guard() -> GuardView:
        raise not_built("guardrails")

    @api.post(
        "/api/v1/guard/attachments", operation_id="postGuardAttachments", tags=["guard"], response_model=GuardAttachment
    )
    async def post_guard_attachments(body: GuardAttachmentRequest) -> GuardAttachment:
        raise not_built("guardrails")

    @api.delete(
        "/api/v1/guard/attachments",
        operation_id="deleteGuardAttachments",
        tags=["guard"],
        response_model=GuardAttachment,
    )
    async def delete_guard_attachments(body: GuardAttachmentRequest) -> GuardAttachment:
        raise not_built("guardrails")

    @api.get("/api/v1/guard/events", operation_id="getGuardEvents", tags=["guard"], response_model=GuardEventsView)
    async def get_guard_events(since: str | None = None) -> GuardEventsView:
        raise not_built("guardrails")

    @api.get("/api/v1/guard/judges", operation_id="getGuardJudges", tags=["guard"], response_model=list[JudgeView])
    async def get_guard_judges() -> list[JudgeView]:
        raise not_built("guardrails")

    @api.post(
        "/api/v1/guard/judges/ask", operation_id="postGuardJudgesAsk", tags=["guard"], response_model=JudgeAskView
    )
    async def post_guard_judges_ask(body: JudgeAskRequest) -> JudgeAskView:
        raise not_built("guardrails")

    @api.get("/api/v1/kb", operation_id="getKb", tags=["kb"], response_model=KBView)
    async def get_kb() -> KBView:
        raise not_built("knowledge bases")

    @api.post(
        "/api/v1/kb/collections",
        operation_id="postKbCollections",
        tags=["kb"],
        response_model=KBCollectionView,
        status_code=201,
    )
    async def post_kb_collections(body: KBCreateRequest) -> KBCollectionView:
        raise not_built("knowledge bases")

    @api.delete(
        "/api/v1/kb/collections/{id}", operation_id="deleteKbCollectionsId", tags=["kb"], response_model=dict[str, Any]
    )
    async def delete_kb_collections_id(id: str) -> dict[str, Any]:
        raise not_built("knowledge bases")

    @api.post(
        "/api/v1/kb/collections/{id}/dataset",
        operation_id="postKbCollectionsIdDataset",
        tags=["kb"],
        response_model=KBDatasetLine,
    )
    async def post_kb_collections_id_dataset(id: str, body: KBDatasetRequest) -> KBDatasetLine:
        raise not_built("knowledge bases")

    @api.get(
        "/api/v1/kb/collections/{id}/documents",
        operation_id="getKbCollectionsIdDocuments",
        tags=["kb"],
        response_model=list[KBDocumentView],
    )
    async def get_kb_collections_id_documents(id: str) -> list[KBDocumentView]:
        raise not_built("knowledge bases")

    @api.delete(
        "/api/v1/kb/collections/{id}/documents",
        operation_id="deleteKbCollectionsIdDocuments",
        tags=["kb"],
        response_model=dict[str, Any],
    )
    async def delete_kb_collections_id_documents(id: str, name: str = Query()) -> dict[str, Any]:
        raise not_built("knowledge bases")

    @api.post("/api/v1/kb/defaults", operation_id="postKbDefaults", tags=["kb"], response_model=KBDefaultView)
    async def post_kb_defaults(body: KBDefaultRequest) -> KBDefaultView:
        raise not_built("knowledge bases")

    @api.post("/api/v1/kb/grants", operation_id="postKbGrants", tags=["kb"], response_model=KBGrantView)
    async def post_kb_grants(body: KBGrantRequest) -> KBGrantView:
        raise not_built("knowledge bases")

    @api.delete("/api/v1/kb/grants", operation_id="deleteKbGrants", tags=["kb"], response_model=KBGrantView)
    async def delete_kb_grants(body: KBGrantRequest) -> KBGrantView:
        raise not_built("knowledge bases")

    @api.post("/api/v1/kb/search", operation_id="postKbSearch", tags=["kb"], response_model=list[KBHitView])
    async def post_kb_search(body: KBSearchRequest) -> list[KBHitView]:
        raise not_built("knowledge bases")

    @api.post(
        "/api/v1/train/jobs", operation_id="postTrainJobs", tags=["train"], response_model=TrainJobView, status_code=201
    )
    async def post_train_jobs(body: TrainRequest) -> TrainJobView:
        raise not_built("training")

    @api.get("/api/v1/train/jobs", operation_id="getTrainJobs", tags=["train"], response_model=list[TrainJobView])
    async def get_train_jobs(limit: int | None = None) -> list[TrainJobView]:
        raise not_built("training")

    @api.get("/api/v1/train/jobs/{id}", operation_id="getTrainJobsId", tags=["train"], response_model=TrainJobView)
    async def get_train_jobs_id(id: str) -> TrainJobView:
        raise not_built("training")

    @api.delete(
        "/api/v1/train/jobs/{id}", operation_id="deleteTrainJobsId", tags=["train"], response_model=dict[str, Any]
    )
    async def delete_train_jobs_id(id: str) -> dict[str, Any]:
        raise not_built("training")

    @api.get(
        "/api/v1/train/jobs/{id}/artifacts/{kind}",
        operation_id="getTrainJobsIdArtifactsKind",
        tags=["train"],
        response_model=dict[str, Any],
    )
    async def get_train_jobs_id_artifacts_kind(id: str, kind: str) -> dict[str, Any]:
        raise not_built("training")

    @api.post(
        "/api/v1/train/jobs/{id}/cancel",
        operation_id="postTrainJobsIdCancel",
        tags=["train"],
        response_model=TrainJobView,
    )
    async def post_train_jobs_id_cancel(id: str) -> TrainJobView:
        raise not_built("training")

    @api.post(
        "/api/v1/train/jobs/{id}/publish",
        operation_id="postTrainJobsIdPublish",
        tags=["train"],
        response_model=TrainPublishView,
    )
    async def post_train_jobs_id_publish(id: str) -> TrainPublishView:
        raise not_built("training")

    return api
