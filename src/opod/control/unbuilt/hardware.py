"""Fabrics, NVLink domains and the facility's power: routed to the spec's letter, each answering 501 until its area is built."""

from __future__ import annotations

from fastapi import APIRouter

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
from opod.control.spec import SpecRouter
from opod.control.unbuilt.base import not_built


def router() -> APIRouter:
    api = SpecRouter()

    @api.post("/api/v1/fabric-test", operation_id="postFabricTest", tags=["fabric-test"], response_model=FabricTestView)
    async def post_fabric_test(body: FabricTestRequest) -> FabricTestView:
        raise not_built("fabrics")

    @api.get("/api/v1/fabrics", operation_id="getFabrics", tags=["fabrics"], response_model=FabricsReport)
    async def get_fabrics() -> FabricsReport:
        raise not_built("fabrics")

    @api.get(
        "/api/v1/fabrics/{id}/topology",
        operation_id="getFabricsIdTopology",
        tags=["fabrics"],
        response_model=TopologyView,
    )
    async def get_fabrics_id_topology(id: str) -> TopologyView:
        raise not_built("fabrics")

    @api.get("/api/v1/facility", operation_id="getFacility", tags=["facility"], response_model=FacilityView)
    async def get_facility() -> FacilityView:
        raise not_built("facility power")

    @api.post("/api/v1/facility/holds", operation_id="postFacilityHolds", tags=["facility"], response_model=HoldView)
    async def post_facility_holds(body: HoldRequest) -> HoldView:
        raise not_built("facility power")

    @api.delete(
        "/api/v1/facility/holds/{domain}",
        operation_id="deleteFacilityHoldsDomain",
        tags=["facility"],
        response_model=HoldView,
    )
    async def delete_facility_holds_domain(domain: str) -> HoldView:
        raise not_built("facility power")

    @api.get("/api/v1/nvlink", operation_id="getNvlink", tags=["nvlink"], response_model=NvlinkReport)
    async def get_nvlink() -> NvlinkReport:
        raise not_built("NVLink")

    return api
