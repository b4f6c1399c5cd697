"""The base of the management API's wire types (``/api/v1``).

The spec marks no field required and writes no ``null``: every field is
optional, absent from an answer when it is ``None`` (the routes serialize
without ``None``), and a request may leave out any of them. A request naming
a field no type has is refused rather than dropped, so nothing a caller sent
is silently lost. Durations travel as integer nanoseconds (``Int64``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, WithJsonSchema

Int64 = Annotated[int, WithJsonSchema({"type": "integer", "format": "int64"})]
"""A Go ``int64``: durations in nanoseconds, byte counts, versions."""


class ApiModel(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", serialize_by_alias=True)
