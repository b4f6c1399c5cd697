"""``POST /api/v1/notify/test``: a test event to every webhook of the cluster's settings, now, with how each answered."""

from __future__ import annotations

from fastapi import APIRouter

from opod.contract.admin.records import NotifyResult
from opod.control.context import ControlContext, ControlError
from opod.control.spec import SpecRouter


def router(ctx: ControlContext) -> APIRouter:
    api = SpecRouter()

    @api.post("/api/v1/notify/test", operation_id="postNotifyTest", tags=["notify"], response_model=list[NotifyResult])
    async def post_notify_test() -> list[NotifyResult]:
        if ctx.notifier is None:
            raise ControlError(
                503,
                "this leader sends no webhooks (it was built without a notifier); notify/test needs opod up's leader",
            )
        answers = await ctx.notifier.test()
        return [NotifyResult(url=url, error=error or None) for url, error in answers]

    return api
