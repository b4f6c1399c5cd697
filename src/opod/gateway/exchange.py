"""One ``/v1`` request's bookkeeping: its usage row, the gateway's counters and its admission slot.

Every request ends exactly once, whatever happens: answered, refused before
relaying, cut off, or left by its client. The usage row is written before the
client has the end of its answer, so an answer that arrived is never missing
from the stream.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from opod.contract.adminapi import SNAPSHOT_KEY_PREFIX
from opod.gateway.relay import Outcome
from opod.gateway.stats import GatewayStats

access = logging.getLogger("opod.access")

if TYPE_CHECKING:
    from opod.access.keytable import KeyEntry


class Exchange:
    __slots__ = ("stats", "ledger", "request_id", "protocol", "probe", "started", "key_id", "model", "ticket",
                 "permit", "ended", "route", "_begun", "access_log")

    def __init__(self, stats: GatewayStats, ledger: Any, request_id: str, protocol: str, probe: bool) -> None:
        self.stats = stats
        self.ledger = ledger
        self.request_id = request_id
        self.protocol = protocol
        self.probe = probe
        """The request carries ``X-Opod-Probe`` (``opod.gateway.stats.PROBE_HEADER``): served, counted nowhere."""
        self.started = time.perf_counter()
        self.key_id = ""
        self.model = ""
        self.ticket: Any = None
        self.permit: Any = None
        self.route: dict | None = None
        self.ended = False
        self._begun = False
        self.access_log = False

    def identify(self, key: KeyEntry | None) -> None:
        if key is not None:
            # Keys from the mounted auth file are recorded as k_cp_<id>, so a manager finds its own ids.
            from_file = getattr(key, "source", "") == "snapshot"
            self.key_id = SNAPSHOT_KEY_PREFIX + key.id.removeprefix(SNAPSHOT_KEY_PREFIX) if from_file else key.id

    def decided(self, record: dict) -> None:
        """The router chose a worker: its record (``Decision.record``) goes with the usage row, after the admission class."""
        self.route = record if self.route is None else {**self.route, **record}

    def begin(self, model: str) -> None:
        """The request is about to be relayed: count it in flight."""
        self.model = model
        self._begun = True
        if not self.probe:
            self.stats.started()

    def sent(self) -> None:
        """The request is on its way to an engine: journal its start (once), while the engine works on it.

        Journaling here rather than before the write keeps it off the request's way to the engine;
        a crash in between loses only a request whose answer nobody received.
        """
        if self.ticket is None and self.ledger is not None and not self.probe:
            self._journal_start()

    def _journal_start(self) -> None:
        self.ticket = self.ledger.begin(request_id=self.request_id, api_key_id=self.key_id, user_id="",
                                        model=self.model, protocol=self.protocol)

    def done(self, outcome: Outcome) -> None:
        if self.ended:
            return
        self.ended = True
        if self.permit is not None:
            self.permit.release()
        if self.access_log:
            access.info("%s %s %s %d %s %dms node=%s key=%s", self.request_id, self.protocol, self.model or "-", outcome.status,
                        outcome.outcome, (time.perf_counter() - self.started) * 1000, outcome.node_id or "-", self.key_id or "-")
        if self.probe:
            return
        if self._begun:
            self.stats.finished(outcome.status)
        else:
            self.stats.refused(outcome.status)
        if outcome.ttft_ms:
            self.stats.ttft(outcome.ttft_ms)
        if self.ledger is None:
            return
        if self.ticket is None:
            self._journal_start()
        usage = outcome.usage or {}
        completion = usage.get("completion_tokens")
        self.ledger.end(
            self.ticket,
            outcome=outcome.outcome,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(completion if isinstance(completion, int) else outcome.tokens_sent),
            latency_ms=int((time.perf_counter() - self.started) * 1000),
            ttft_ms=outcome.ttft_ms,
            node_id=outcome.node_id,
            route=self.route,
        )

    def refuse(self, status: int) -> None:
        self.done(Outcome(status, "error"))
