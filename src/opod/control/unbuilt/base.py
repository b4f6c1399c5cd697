"""The answer of an operation whose area is not built yet: 501 with an ``ErrorView`` naming the area."""

from __future__ import annotations

from opod.control.context import ControlError


def not_built(area: str) -> ControlError:
    return ControlError(
        501,
        f"this opod does not have the management API's {area} yet; the operation is in the document so clients can see it",
    )
