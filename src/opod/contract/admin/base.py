"""The base of the management API's wire types (``/api/v1``).

The spec marks no field required and writes no ``null``: every field is
optional, absent from an answer when it is ``None`` (the routes serialize
without ``None``), and a request may leave out any of them. A request naming
a field no type has is refused rather than dropped, so nothing a caller sent
is silently lost. Durations travel as integer nanoseconds (``Int64``).

A type a request carries (:class:`ApiRequest`, and every type inside one)
takes each field only in its JSON type: ``"yes"`` is no boolean, ``true`` no
number and ``"3"`` no integer, so a caller's mistake is refused naming the
field rather than read as something it did not say. A whole number is still a
``number`` (``1`` for a float field), and a time is its RFC 3339 text
(:data:`Timestamp`). Types only answered stay as they are.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Strict, WithJsonSchema

Int64 = Annotated[int, WithJsonSchema({"type": "integer", "format": "int64"})]
"""A Go ``int64``: durations in nanoseconds, byte counts, versions."""


def _time_text(value: Any) -> Any:
    if isinstance(value, str | datetime):
        return value
    raise ValueError("send a time as RFC 3339 text, such as 2026-09-01T12:00:00Z")


Timestamp = Annotated[datetime, Strict(False), BeforeValidator(_time_text)]
"""A time in a request: RFC 3339 text on the wire (a ``datetime`` from Python), never a number of seconds."""


class ApiModel(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", serialize_by_alias=True)


class ApiRequest(ApiModel):
    """A type some request of ``/api/v1`` carries: every field taken only in its JSON type."""

    model_config = ConfigDict(strict=True)
