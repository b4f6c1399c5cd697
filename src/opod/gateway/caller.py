"""Who a ``/v1`` request made in process is for, and the handler shape that takes it.

A request from the wire proves its caller with its ``Authorization`` header. One made in
process (a batch's line, a replay: :meth:`opod.gateway.app.Gateway.serve_as`) is for a caller
checked already, given as a parameter beside the request: no header can stand in for one.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from opod.access.keytable import KeyEntry


@dataclass(frozen=True, slots=True)
class InProcessCaller:
    """The caller of a request made in process: its key entry (``None``: anonymous, where keys are not required)."""

    key: KeyEntry | None


class Endpoint(Protocol):
    """A ``/v1`` handler: from the wire with the request alone, in process with its caller too."""

    def __call__(self, request: Request, caller: InProcessCaller | None = None) -> Awaitable[Response]: ...
