"""One ``/v1`` request's bookkeeping: its usage row, the gateway's counters and its admission slot.

Every request ends exactly once, whatever happens: answered, refused before
relaying, cut off, or left by its client. The usage row is written before the
client has the end of its answer, so an answer that arrived is never missing
from the stream. A stream cut off or left before the engine's usage chunk
records the completion tokens actually streamed and its prompt tokens counted
after the fact (:mod:`opod.gateway.usagecount`), a moment later.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from opod.access.keytable import KeyEntry
from opod.contract.adminapi import SNAPSHOT_KEY_PREFIX
from opod.gateway.admission import Permit
from opod.gateway.outcome import Outcome
from opod.gateway.stats import GatewayStats
from opod.gateway.usagecount import PromptCounter, estimate
from opod.ledger.records import UsageTicket

access = logging.getLogger("opod.access")


class UsageRecorder(Protocol):
    """Where usage rows go: what the gateway calls on ``opod.ledger.Ledger``."""

    def begin(self, *, request_id: str, api_key_id: str, user_id: str, model: str, protocol: str) -> UsageTicket: ...

    def end(self, ticket: UsageTicket, *, outcome: str, prompt_tokens: int, completion_tokens: int, latency_ms: int,
            ttft_ms: int = 0, node_id: str = "", route: dict | None = None) -> None: ...

    def progress(self, ticket: UsageTicket, *, prompt_tokens: int, completion_tokens: int, node_id: str = "") -> None: ...


class Exchange:
    """Implements ``opod.gateway.relay.RelayObserver``: the relay tells it what happened, it records it."""

    __slots__ = ("stats", "ledger", "request_id", "protocol", "probe", "started", "key_id", "model", "ticket",
                 "permit", "ended", "route", "_begun", "access_log", "prompts", "payload", "prompt_estimate")

    def __init__(self, stats: GatewayStats, ledger: UsageRecorder, request_id: str, protocol: str, probe: bool,
                 access_log: bool, prompts: PromptCounter | None = None) -> None:
        self.stats = stats
        self.ledger = ledger
        self.request_id = request_id
        self.protocol = protocol
        self.probe = probe
        """The request carries ``X-Opod-Probe`` (``opod.gateway.stats.PROBE_HEADER``): served, counted nowhere."""
        self.access_log = access_log
        self.started = time.perf_counter()
        self.key_id = ""
        self.model = ""
        self.ticket: UsageTicket | None = None
        self.permit: Permit | None = None
        self.route: dict | None = None
        self.ended = False
        self._begun = False
        self.prompts = prompts
        """Counts the prompt of a stream that ended before the engine's usage chunk; ``None``: recorded as 0."""
        self.payload: dict | None = None
        """The request as relayed (set once parsed), for that count."""
        self.prompt_estimate: int | None = None
        """The prompt's tokens estimated from its size, made at a stream's first progress report."""

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
        if self.ticket is None and not self.probe:
            self._journal_start()

    def _journal_start(self) -> UsageTicket:
        ticket = self.ticket = self.ledger.begin(request_id=self.request_id, api_key_id=self.key_id, user_id="",
                                                 model=self.model, protocol=self.protocol)
        return ticket

    def streaming(self, tokens_sent: int, node_id: str) -> None:
        """A stream has sent ``tokens_sent`` tokens so far: journaled, so a crash of the leader leaves a row that says so."""
        if self.ticket is None or self.ended:
            return
        if self.prompt_estimate is None:
            self.prompt_estimate = estimate(self.payload) if self.payload is not None else 0
        self.ledger.progress(self.ticket, prompt_tokens=self.prompt_estimate, completion_tokens=tokens_sent, node_id=node_id)

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
        ticket = self.ticket if self.ticket is not None else self._journal_start()
        usage = outcome.usage or {}
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        latency_ms = int((time.perf_counter() - self.started) * 1000)
        # Without the engine's usage, the completion tokens are those streamed (outcome.tokens_sent).
        completion_tokens = int(completion if isinstance(completion, int) else outcome.tokens_sent)

        def record(prompt_tokens: int, route: dict | None) -> None:
            self.ledger.end(ticket, outcome=outcome.outcome, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            latency_ms=latency_ms, ttft_ms=outcome.ttft_ms, node_id=outcome.node_id, route=route)

        if isinstance(prompt, int) or self.prompts is None or self.payload is None or not _cut_short(outcome):
            record(int(prompt or 0), self.route)
            return
        route = self.route
        self.prompts.later(outcome.node_id, self.model, self.payload,
                           lambda tokens, how: record(tokens, {**(route or {}), "prompt_tokens": how}))

    def refuse(self, status: int) -> None:
        self.done(Outcome(status, "error"))


def _cut_short(outcome: Outcome) -> bool:
    """A stream the engine had begun to answer, left by its client (``cancelled``) or broken off (502):
    the engine read its prompt, but its usage chunk never came."""
    return outcome.outcome == "cancelled" or (outcome.outcome == "error" and outcome.status == 502)
