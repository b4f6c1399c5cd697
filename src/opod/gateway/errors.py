"""Typed refusals of ``/v1`` that belong to the gateway's own rules (budgets, quotas), in OpenAI's error shape."""

from __future__ import annotations

from opod.http.errors import GatewayError


class BudgetExceeded(GatewayError):
    """A scope's spend and the requests in flight have used its budget for the period: refused before any engine.

    ``insufficient_quota`` is OpenAI's type and code for spend that ran out, so clients that stop
    retrying on it do so here too; ``Retry-After`` is the seconds until the period ends.
    """

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"

    def __init__(self, message: str, *, scope: str, period: str, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})
        self.scope = scope
        self.period = period
