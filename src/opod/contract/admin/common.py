"""Wire types of the management API that more than one of its areas uses."""

from __future__ import annotations

from pydantic import ConfigDict

from opod.contract.admin.base import ApiModel, ApiRequest, Int64


class BenchSLO(ApiRequest):
    model_config = ConfigDict(title="bench.SLO")
    TTFTp99: Int64 | None = None
    TPOTp99: Int64 | None = None


class ErrorView(ApiModel):
    error: str | None = None


class JudgeView(ApiModel):
    model: str | None = None
    policies: list[str] | None = None
    closed: list[str] | None = None
    then: list[str] | None = None
    in_catalog: bool | None = None
    judge: bool | None = None
    ready_replicas: int | None = None
    wanted_replicas: int | None = None
    last_error: str | None = None
    last_error_at: str | None = None
    problem: str | None = None


class Removed(ApiModel):
    removed: str | None = None
