"""The leader watching its models' canaries: each run judged every few seconds, a failing candidate rolled back.

Each round follows the definitions (:meth:`opod.fleet.canaries.CanaryBook.sync`), then judges every
run that still has a share or a shadow (:func:`opod.fleet.canaries.judge`); a verdict is handed to
:meth:`opod.fleet.canaries_service.CanariesService.roll_back`, which applies it only to that very run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opod.fleet.canaries import CanaryBook, judge
from opod.fleet.canaries_service import CanariesService
from opod.fleet.models import ModelRegistry

log = logging.getLogger("opod.leader")

WATCH_EVERY = 1.0
"""Seconds between rounds: a candidate over its limits serves about this much longer."""


class CanaryWatch:
    """Runs the rollback rule over every canary while the leader runs."""

    def __init__(
        self, service: CanariesService, book: CanaryBook, models: ModelRegistry, every: float = WATCH_EVERY
    ) -> None:
        self._service = service
        self._book = book
        self._models = models
        self._every = every

    async def round(self) -> int:
        """One round: the canaries rolled back."""
        self._book.sync(self._models)
        rolled = 0
        for run in list(self._book):
            if run.withdrawn:
                continue
            verdict = judge(run)
            if verdict is None:
                continue
            try:
                rolled += await self._service.roll_back(run, verdict)
            except Exception:  # one canary's failed write must not stop the others' watch
                log.exception("rolling back the canary %s of %s failed", run.candidate_model, run.model)
        return rolled

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.round()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every)
