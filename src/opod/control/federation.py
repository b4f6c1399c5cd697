"""``/api/v1/federation``: other opod clusters as providers, their models offered here as ``PEER/MODEL``.

The peers, their checks and their models are :class:`opod.fleet.federation.Federation`'s; these
handlers parse, call it, and shape its answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from opod.contract.admin.common import Removed
from opod.contract.admin.services import FederationAddRequest, FederationModelStatus, FederationStatus, FederationView
from opod.control.audit import audit_draft
from opod.control.spec import SpecRouter
from opod.fleet.federation import Federation, Peer
from opod.store.audit import AuditDraft


def status(peer: Peer) -> FederationStatus:
    record = peer.record
    return FederationStatus(
        name=record.name,
        url=record.url,
        key_file=record.key_file,
        send_tags=record.send_tags,
        cluster=peer.cluster or None,
        up=peer.up,
        checked=peer.checked,
        latency_ns=peer.latency_ns or None,
        latency_ms=round(peer.latency_ns / 1e6, 3) if peer.latency_ns else None,
        error=peer.error or None,
        synced_at=peer.synced_at,
        models=[
            FederationModelStatus(name=m.name, upstream=m.upstream, withdrawn=m.withdrawn or None)
            for m in sorted(peer.models.values(), key=lambda m: m.name)
        ],
        created_at=record.created_at,
        created_by=record.created_by or None,
    )


def router(federation: Federation) -> APIRouter:
    api = SpecRouter()

    @api.get("/api/v1/federation", operation_id="getFederation", tags=["federation"], response_model=FederationView)
    async def get_federation() -> FederationView:
        return FederationView(cluster=federation.cluster, peers=[status(p) for p in federation.peers()])

    @api.post(
        "/api/v1/federation",
        operation_id="postFederation",
        tags=["federation"],
        response_model=FederationStatus,
        status_code=201,
    )
    async def post_federation(body: FederationAddRequest, draft: AuditDraft = Depends(audit_draft)) -> FederationStatus:
        peer = await federation.add(body.name or "", body.url or "", body.key_file or "", bool(body.send_tags), draft)
        return status(peer)

    @api.delete(
        "/api/v1/federation/{peer}", operation_id="deleteFederationPeer", tags=["federation"], response_model=Removed
    )
    async def delete_federation_peer(peer: str, draft: AuditDraft = Depends(audit_draft)) -> Removed:
        removed = await federation.remove(peer, draft)
        return Removed(removed=removed.record.name)

    @api.post(
        "/api/v1/federation/{peer}/sync",
        operation_id="postFederationPeerSync",
        tags=["federation"],
        response_model=FederationStatus,
    )
    async def post_federation_peer_sync(peer: str) -> FederationStatus:
        return status(await federation.sync(peer))

    return api
