"""``POST /api/v1/notify/test``: a test event to every webhook of the cluster's settings, now, with how each answered."""

from __future__ import annotations

from fastapi import APIRouter

from opod.contract.admin.records import NotifyResult
from opod.control.context import Notifier
from opod.control.spec import SpecRouter


def router(notifier: Notifier) -> APIRouter:
    api = SpecRouter()

    @api.post("/api/v1/notify/test", operation_id="postNotifyTest", tags=["notify"], response_model=list[NotifyResult])
    async def post_notify_test() -> list[NotifyResult]:
        answers = await notifier.test()
        return [NotifyResult(url=url, error=error or None) for url, error in answers]

    return api
