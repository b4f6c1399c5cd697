"""One ``/v1`` request's bookkeeping: its usage row, the gateway's counters and its admission slot.

Every request ends exactly once, whatever happens: answered, refused before
relaying, cut off, or left by its client. The usage row is written before the
client has the end of its answer, so an answer that arrived is never missing
from the stream. A stream cut off or left before the engine's usage chunk
records the completion tokens actually streamed and its prompt tokens counted
after the fact (:mod:`opod.gateway.usagecount`), a moment later. A request
its client left is recorded ``cancelled``: with nothing when no engine had it
yet, else with its prompt counted and, for a whole answer the engine never
finished, the completion tokens its time at the engine stands for.

An answer the ``post`` guardrails judge is held: the relay's end of it only frees the
engine slot, and the row is written once the guardrails have decided (:meth:`Exchange.release`),
with the status the client gets (a block's 400, an unavailable guardrail's 503) and the tokens
the engine spent.

The record owns its request's life cycle: the gateway tells it each stage as it passes
(:meth:`Exchange.identified`, :meth:`~Exchange.parsed`, :meth:`~Exchange.reserved`,
:meth:`~Exchange.admitted`, :meth:`~Exchange.relaying`), the relay tells it where the request
went and how it ended (:meth:`~Exchange.routed`, :meth:`~Exchange.leased`, :meth:`~Exchange.sent`,
:meth:`~Exchange.ended`), and :meth:`Exchange.ended` is the one place that releases what the
request holds: its admission slot, its worker lease and its budget reservation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any

from opod.access.keytable import KeyEntry
from opod.fleet.canaries import CanaryRun, is_fault
from opod.fleet.router import RouteRecord
from opod.fleet.state import Lease
from opod.gateway.admission import Permit
from opod.gateway.budgets import NO_RESERVATION, BudgetExceeded, BudgetScope, Reservation
from opod.gateway.guardrails import GuardNote
from opod.gateway.kept_bodies import request_labels
from opod.gateway.meter import ATTRIBUTIONS_KEPT, Attribution, Meter
from opod.gateway.outcome import Outcome
from opod.gateway.usagecount import estimate
from opod.ledger.records import UsageTicket

access = logging.getLogger("opod.access")

TIMING_HEADER = "Server-Timing"
"""``opod;dur=<ms>, upstream;dur=<ms>``: where an answer's time went before its headers left.

``upstream`` is the answering worker's time, from sending it the request to its whole answer
(to its first byte when streamed); ``opod`` is the rest, from the request's arrival: reading,
checking, queueing for a slot, routing, failed attempts, recording the answer, the guard policies'
reading of a whole answer and keeping its body. The relay tells the request's record its upstream
time (``RelayObserver.answered``); the gateway adds the header as the answer leaves it
(:meth:`Exchange.server_timing`)."""


class Exchange:
    """One ``/v1`` request's record, from its arrival to its usage row.

    Implements ``opod.gateway.relay.RelayObserver``: the relay tells it what happened, it records it.
    """

    __slots__ = (
        "meter",
        "request_id",
        "protocol",
        "probe",
        "started",
        "key_id",
        "model",
        "ticket",
        "permit",
        "lease",
        "ended_with",
        "route",
        "_begun",
        "access_log",
        "payload",
        "prompt_estimate",
        "user_id",
        "project_id",
        "team_id",
        "org_id",
        "scopes",
        "reservation",
        "end_user",
        "tags",
        "queue_ms",
        "body_state",
        "guard",
        "hold",
        "held",
        "sent_at",
        "upstream_s",
        "prompt_count",
        "completion_cap",
        "canary",
    )

    def __init__(self, meter: Meter, request_id: str, protocol: str, probe: bool, access_log: bool) -> None:
        self.meter = meter
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
        """Its admission slot, from :meth:`admitted` to its end."""
        self.lease: Lease | None = None
        """Its hold on the worker of the current attempt (counted in the worker's in-flight), to its end."""
        self.route: RouteRecord | None = None
        self.ended_with: Outcome | None = None
        """How it ended, once it has."""
        self._begun = False
        self.payload: dict[str, Any] | None = None
        """The request as relayed (set once parsed), for the prompt count of a stream cut short."""
        self.prompt_estimate: int | None = None
        """The prompt's tokens estimated from its size, made at a stream's first progress report."""
        self.user_id = self.project_id = self.team_id = self.org_id = ""
        """Who the request is attributed to: the key's person and project, the project's team and org."""
        self.scopes: tuple[BudgetScope, ...] = ()
        """The scopes it is spent in, narrowest first: its key, person, project, team and org."""
        self.reservation: Reservation = NO_RESERVATION
        self.end_user = ""
        """OpenAI's ``user`` field of the request."""
        self.tags: dict[str, str] | None = None
        """OpenAI's ``metadata`` of the request, capped (``opod.gateway.kept_bodies.request_labels``)."""
        self.queue_ms = 0
        """How long the request waited for an admission slot."""
        self.body_state = ""
        """Whether its bodies are kept, or why not (``opod.gateway.kept_bodies``); '' when not decided."""
        self.guard: GuardNote | None = None
        """What the guardrails did to it; ``None``: the policy has none."""
        self.hold = False
        """Its answer waits for the ``post`` guardrails: the relay's end is held (:attr:`held`) until :meth:`let_through`."""
        self.held: Outcome | None = None
        self.sent_at = 0.0
        """``time.perf_counter()`` when the last attempt was written to its engine; 0 before."""
        self.upstream_s = -1.0
        """The answering attempt's time at its upstream (:meth:`answered`); negative while none answered."""
        self.prompt_count: int | None = None
        """The prompt's tokens as a worker counted them on the request's way (its budget reservation), if one did."""
        self.completion_cap: int | None = None
        """The most completion tokens the request can make (its reservation's), if known."""
        self.canary: tuple[CanaryRun, bool] | None = None
        """Its model's canary run, and whether it was drawn to the candidate: its end is counted on that side."""

    # --- the stages, in the order a request passes them -------------------------------------------

    def identified(self, key: KeyEntry | None) -> None:
        """The caller is known: the request is attributed to its key, person and project, the project's team and org."""
        if key is None:
            return
        meter = self.meter
        tenancy = meter.tenancy
        project = key.project_id
        try:
            chain = tenancy.chain(project) if project and tenancy is not None else None
        except LookupError:
            chain = None
        kept = meter.attributions.get(key.id)
        if kept is None or kept.key is not key or kept.chain is not chain:
            kept = meter.attributions[key.id] = Attribution.of(key, chain)
            if len(meter.attributions) > ATTRIBUTIONS_KEPT:
                meter.attributions.clear()  # keys made and dropped by the thousand: start again
        self.key_id, self.user_id, self.project_id = kept.key_id, key.user_id, project
        self.team_id, self.org_id = kept.team_id, kept.org_id
        self.scopes = kept.scopes

    def parsed(self, model: str, payload: dict[str, Any]) -> None:
        """Its body is read and checked: the model it goes to, the body as relayed, and its ``user`` and ``metadata``."""
        self.model = model
        self.payload = payload
        self.end_user, self.tags = request_labels(payload)

    def keeping(self, body_state: str) -> None:
        """Whether its bodies are kept (``opod.gateway.kept_bodies``), for its row."""
        self.body_state = body_state

    def counted(self, prompt_tokens: int) -> None:
        """A worker counted its prompt's tokens as its engine will (for its reservation)."""
        self.prompt_count = prompt_tokens

    def capped(self, completion_tokens: int) -> None:
        """The most completion tokens it can make."""
        self.completion_cap = completion_tokens

    @property
    def budgeted(self) -> bool:
        """A budget governs one of its scopes: it is reserved before any engine sees it."""
        budgets = self.meter.budgets
        return budgets is not None and not self.probe and budgets.governs(self.scopes)

    def reserved(self, micros: int) -> None:
        """Hold ``micros`` against its scopes' budgets until it ends; :class:`BudgetExceeded`, recorded, when one
        would pass its budget."""
        budgets = self.meter.budgets
        if budgets is None:
            return
        try:
            self.reservation = budgets.reserve(self.scopes, micros)
        except BudgetExceeded as refusal:
            self.route = {"limited": "budget", "scope": refusal.scope, "period": refusal.period}
            raise

    def guarded(self) -> GuardNote:
        """Guardrails or guard policies check it: what they do to the request is noted for its row (one note for
        both)."""
        if self.guard is None:
            self.guard = GuardNote()
        return self.guard

    def admitted(self, permit: Permit, admission_class: str, queue_ms: int = 0) -> None:
        """It holds an engine slot of its class, after waiting ``queue_ms`` for it."""
        self.permit = permit
        self.queue_ms = queue_ms
        self.route = {"class": admission_class}

    def relaying(self, hold: bool = False) -> None:
        """It is about to be relayed: count it in flight (once: a fallback after a refusal is the same request).
        ``hold``: its row waits for the post guardrails' verdict."""
        if self._begun:
            return
        self._begun = True
        self.hold = hold
        if not self.probe:
            self.meter.stats.started()

    def routed(self, record: RouteRecord) -> None:
        """The router chose a worker: its record (``Decision.record``) goes with the usage row, after the admission class."""
        self.route = record if self.route is None else {**self.route, **record}

    def canaried(self, run: CanaryRun, candidate: bool) -> None:
        """Its model has a canary: it was drawn to the candidate (``candidate``) or stays with the model."""
        self.canary = (run, candidate)

    def fell_back(self, target: str) -> None:
        """No worker could serve its model: it goes to ``target`` (a catalog fallback model, or the policy's URL)."""
        self.route = {**(self.route or {}), "fallback": target}

    def leased(self, lease: Lease) -> None:
        """An attempt holds a worker: the hold of an attempt before it, which moved on, is let go."""
        if self.lease is not None:
            self.lease.release()
        self.lease = lease

    def sent(self) -> None:
        """The request is on its way to an engine: journal its start (once), while the engine works on it.

        Journaling here rather than before the write keeps it off the request's way to the engine;
        a crash in between loses only a request whose answer nobody received.
        """
        self.sent_at = time.perf_counter()
        if self.ticket is None and not self.probe:
            self._journal_start()

    def answered(self, upstream_s: float) -> None:
        self.upstream_s = upstream_s

    def server_timing(self) -> bytes | None:
        """The answer's ``Server-Timing`` value, made as its headers leave (:data:`TIMING_HEADER`):
        opod's own time from the request's arrival, then its upstream's; ``None`` when no upstream answered."""
        upstream = self.upstream_s
        if upstream < 0:
            return None
        own = time.perf_counter() - self.started - upstream
        return b"opod;dur=%.3f, upstream;dur=%.3f" % (own * 1000, upstream * 1000)

    def _journal_start(self) -> UsageTicket:
        # The pre guardrails' outcome goes with the start, so a row recovered after a crash keeps it.
        guard = self.guard.fields() if self.guard is not None else None
        ticket = self.ticket = self.meter.ledger.begin(
            request_id=self.request_id,
            api_key_id=self.key_id,
            user_id=self.user_id,
            model=self.model,
            protocol=self.protocol,
            project_id=self.project_id,
            team_id=self.team_id,
            org_id=self.org_id,
            end_user=self.end_user,
            tags=self.tags,
            details=guard or None,
        )
        return ticket

    def streaming(self, tokens_sent: int, node_id: str) -> None:
        """A stream has sent ``tokens_sent`` tokens so far: journaled, so a crash of the leader leaves a row that says so."""
        if self.ticket is None or self.ended_with is not None:
            return
        if self.prompt_estimate is None:
            self.prompt_estimate = estimate(self.payload) if self.payload is not None else 0
        self.meter.ledger.progress(
            self.ticket, prompt_tokens=self.prompt_estimate, completion_tokens=tokens_sent, node_id=node_id
        )

    def ended(self, outcome: Outcome) -> None:
        """It ended (once; later calls are ignored): everything it holds is let go, and its row is written."""
        if self.ended_with is not None:
            return
        # The engine's work on it is over: its slot and its worker are let go.
        if self.permit is not None:
            self.permit.release()
            self.permit = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.hold:
            # The post guardrails have yet to judge the answer: the engine's slot went now, the row after them.
            self.hold, self.held = False, outcome
            return
        self.ended_with = outcome
        meter = self.meter
        if self.access_log:
            access.info(
                "%s %s %s %d %s %dms node=%s key=%s",
                self.request_id,
                self.protocol,
                self.model or "-",
                outcome.status,
                outcome.outcome,
                (time.perf_counter() - self.started) * 1000,
                outcome.node_id or "-",
                self.key_id or "-",
            )
        if self.probe:
            self.reservation.settle(0)
            return
        stats = meter.stats
        if self._begun:
            stats.finished(outcome.status)
        else:
            stats.refused(outcome.status)
        if outcome.ttft_ms:
            stats.ttft(outcome.ttft_ms)
        ticket = self.ticket if self.ticket is not None else self._journal_start()
        now = time.perf_counter()
        latency_ms = int((now - self.started) * 1000)
        if self.canary is not None and not self.canary[0].withdrawn:
            run, candidate = self.canary
            run.side(candidate).add(
                error=is_fault(outcome.status, outcome.engine_failed),
                ttft_ms=outcome.ttft_ms,
                latency_ms=latency_ms,
                streamed=self.payload is not None and self.payload.get("stream") is True,
            )
        usage = outcome.usage or {}
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        # Without the engine's usage, the completion tokens are those streamed (outcome.tokens_sent), or
        # those the engine's time on a whole answer stands for.
        if isinstance(completion, int):
            completion_tokens, engine_counted = int(completion), True
        else:
            completion_tokens, engine_counted = outcome.tokens_sent, False
        route = self.route
        rates = meter.rates
        served_model = self.served_model
        if engine_counted:
            if outcome.outcome == "ok" and rates is not None and self.sent_at:
                rates.learn(served_model, completion_tokens, now - self.sent_at)
        elif outcome.working_s and not outcome.tokens_sent and rates is not None:
            guess = rates.estimate(served_model, outcome.working_s, self.completion_cap)
            if guess is not None:
                completion_tokens = guess
                route = {**(route or {}), "completion_tokens": "estimated"}
        details = self.details(outcome, served_model)
        if isinstance(prompt, int) or self.payload is None or not _cut_short(outcome):
            self._record(ticket, outcome, completion_tokens, latency_ms, details, int(prompt or 0), route)
            return
        if self.prompt_count is not None:
            counted = {**(route or {}), "prompt_tokens": "counted"}
            self._record(ticket, outcome, completion_tokens, latency_ms, details, self.prompt_count, counted)
            return
        if meter.prompts is None:
            self._record(ticket, outcome, completion_tokens, latency_ms, details, 0, route)
            return
        then = partial(self._record_counted, ticket, outcome, completion_tokens, latency_ms, details, route)
        meter.prompts.later(outcome.node_id, self.model, self.payload, then)

    def _record(
        self,
        ticket: UsageTicket,
        outcome: Outcome,
        completion_tokens: int,
        latency_ms: int,
        details: dict[str, object],
        prompt_tokens: int,
        route: RouteRecord | None,
    ) -> None:
        """Settle its reservation and write its row: at its end, or once its prompt is counted (in another thread)."""
        # Priced at the request's end, at the prices in force then.
        meter = self.meter
        budgets = meter.budgets
        cost = budgets.cost(self.model, prompt_tokens, completion_tokens) if budgets is not None else 0
        self.reservation.settle(cost)
        meter.ledger.end(
            ticket,
            outcome=outcome.outcome,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            ttft_ms=outcome.ttft_ms,
            node_id=outcome.node_id,
            route=route,
            cost_micros=cost,
            details=details,
        )

    def _record_counted(
        self,
        ticket: UsageTicket,
        outcome: Outcome,
        completion_tokens: int,
        latency_ms: int,
        details: dict[str, object],
        route: RouteRecord | None,
        prompt_tokens: int,
        how: str,
    ) -> None:
        """:meth:`_record` with a prompt counted after the fact; ``how`` it was found goes with its route."""
        counted = {**(route or {}), "prompt_tokens": how}
        self._record(ticket, outcome, completion_tokens, latency_ms, details, prompt_tokens, counted)

    def refused(self, status: int) -> None:
        """The client is refused with ``status``; an answer held for the post guardrails is recorded with it."""
        self.hold = False
        held, self.held = self.held, None
        self.ended(Outcome(status, "error") if held is None else replace(held, status=status, outcome="error"))

    def let_through(self) -> None:
        """The post guardrails let the answer through: record the end the relay reported."""
        self.hold = False
        held, self.held = self.held, None
        if held is not None:
            self.ended(held)

    def abandoned(self, why: BaseException) -> None:
        """The request stopped without an answer: its client left (cancelled), or it failed.

        An end held for the post guardrails is recorded as cancelled. Otherwise a request no engine had
        yet ends with nothing spent; one an engine worked on, with what the relay could not report: its
        prompt, and the completion its time at the engine stands for.
        """
        self.hold = False
        held, self.held = self.held, None
        if held is not None:
            self.ended(replace(held, status=499, outcome="cancelled"))
            return
        if self.ended_with is not None:
            return
        left = isinstance(why, asyncio.CancelledError)
        status, outcome = (499, "cancelled") if left else (500, "error")
        if self.ticket is None:
            self.ended(Outcome(status, outcome, usage={"prompt_tokens": 0, "completion_tokens": 0}))
            return
        worker = self.route.get("worker") if self.route is not None else None
        # What the engine made for a client that left is the client's; a failure of opod's own is not.
        working = time.perf_counter() - self.sent_at if left and self.sent_at else 0.0
        self.ended(Outcome(status, outcome, worker if isinstance(worker, str) else "", working_s=working))

    @property
    def served_model(self) -> str:
        """The model that answered: the catalog fallback the request went to, else the one asked."""
        route = self.route
        if route is not None and "fallback" in route:  # tested first: most requests have no fallback
            fallback = route["fallback"]
            if isinstance(fallback, str) and fallback and "://" not in fallback:
                return fallback
        if self.canary is not None and self.canary[1]:
            return self.canary[0].candidate_model
        return self.model

    def details(self, outcome: Outcome, served_model: str | None = None) -> dict[str, object]:
        """The usage row's request record fields (``Ledger.end``'s ``details``); ``served_model`` when known already."""
        guard = self.guard
        # The guard's fields are a dict of their own: the rest is added to it.
        details = guard.fields() if guard is not None else {}
        details["status"] = outcome.status
        details["served_model"] = self.served_model if served_model is None else served_model
        if self.queue_ms:
            details["queue_ms"] = self.queue_ms
        if self.body_state:
            details["body_state"] = self.body_state
        # A cache hit: the engine reused cached prompt tokens (its usage says so), or the router sent the request
        # to a worker holding its leading prefix blocks (``blocks`` ``n/m`` with n > 0).
        usage, route = outcome.usage, self.route
        prompt_details = usage.get("prompt_tokens_details") if usage else None
        cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
        if isinstance(cached, int) and cached > 0:
            details["cache_hit"] = True
        elif route is not None and "blocks" in route:
            blocks = route["blocks"]
            if isinstance(blocks, str) and not blocks.startswith("0/"):
                details["cache_hit"] = True
        return details


def _cut_short(outcome: Outcome) -> bool:
    """A stream the engine had begun to answer, left by its client (``cancelled``) or broken off (502):
    the engine read its prompt, but its usage chunk never came."""
    return outcome.outcome == "cancelled" or (outcome.outcome == "error" and outcome.status == 502)
