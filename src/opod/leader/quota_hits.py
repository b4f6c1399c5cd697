"""``quota.hit``: said once when a model's replica is refused by a quota, and again only when the scope changes."""

from __future__ import annotations

import logging

from opod.fleet.followers import EventSink
from opod.fleet.placed import Rejection
from opod.fleet.quotas import QuotaBook

log = logging.getLogger("opod.leader")


class QuotaHits:
    def __init__(self, emit: EventSink | None) -> None:
        self.emit = emit
        self._last: dict[str, str] = {}
        """model → the scope whose quota refused it last, so ``quota.hit`` is emitted once per refusal, not each round."""

    def placed(self, model_id: str) -> None:
        """A replica of the model was placed: a later refusal is news again."""
        self._last.pop(model_id, None)

    def unplaced(self, model_id: str, rejections: list[Rejection], book: QuotaBook | None) -> None:
        """No node took a replica of the model; said when a quota was why and its scope is new."""
        reason = next((r.reason for r in rejections if r.reason.startswith("quota:")), "")
        if not reason:
            self._last.pop(model_id, None)
            return
        scope = book.refused.get(model_id, "") if book is not None else ""
        if self._last.get(model_id) == scope:
            return
        self._last[model_id] = scope
        log.info("%s: no replica placed: %s", model_id, reason)
        if self.emit is not None:
            self.emit("quota.hit", scope or model_id, {"scope": scope, "model": model_id, "reason": reason})
