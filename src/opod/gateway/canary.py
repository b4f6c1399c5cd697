"""A model's traffic split on the ``/v1`` path: its canary, or the mounted policy's plan revisions, and shadow copies.

Each request is drawn into one group once (:func:`opod.fleet.router.choose_group`, fixed by its
request id, so a retry stays in its group): a model's canary (:mod:`opod.fleet.canaries`) splits
between the model and its candidate, and the mounted policy's ``revisions`` split between plan
revisions of the workers; a model with a canary taking a share is split by it. The group goes on the
usage row's route as ``canary`` (the model drawn, or the plan revision), and a canary's request is
counted on its side of the run. A candidate cannot be named by clients (404, as an unknown model),
except with the admin key.

A canary at 0 percent runs in shadow: each request of the model is copied to the candidate in the
background, its answer read and discarded, its errors and times counted on the candidate's side, with
no usage row and nothing billed. At most :data:`MAX_SHADOWS` copies run at once; past that a copy is
skipped, never waited for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse

from opod.access.keytable import KeyEntry
from opod.fleet.canaries import CanaryBook, CanaryRun, is_fault
from opod.fleet.router import RouteRecord, RouteRequest, RoutingPolicy, choose_group
from opod.fleet.state import Fleet, Lease
from opod.gateway.exchange import Exchange
from opod.gateway.outcome import Outcome
from opod.gateway.relay import Relay, RelayCall
from opod.http.errors import GatewayError, ModelNotFound

log = logging.getLogger("opod.gateway")

MAX_SHADOWS = 32
ADMIN_KIND = "admin"


@dataclass(frozen=True, slots=True)
class Group:
    """Where a drawn request goes: a model (the candidate or the stable one), or a plan revision of the model's workers."""

    model: str
    revision: int | None = None
    canary: str | None = None


class CanarySplit:
    """Draws each request's group, copies requests to a candidate in shadow, and hides candidates from clients."""

    def __init__(self, book: CanaryBook | None, fleet: Fleet, relay: Relay) -> None:
        self.book = book
        self.fleet = fleet
        self.relay = relay
        self._shadows: set[asyncio.Task[None]] = set()

    def check_named(self, model: str, key: KeyEntry | None) -> None:
        """:class:`ModelNotFound` for a candidate named by a client (the admin key may name it)."""
        if self.book is None or self.book.candidate_of(model) is None:
            return
        if key is not None and key.kind == ADMIN_KIND:
            return
        raise ModelNotFound(model, [])

    def hidden(self, model: str) -> bool:
        """Whether ``model`` is a candidate, left out of the models clients are shown."""
        return self.book is not None and self.book.candidate_of(model) is not None

    def route(
        self,
        model: str,
        routing: RoutingPolicy,
        exchange: Exchange,
        call: RelayCall,
        payload: dict[str, Any],
    ) -> tuple[RouteRequest, RelayCall]:
        """The request's group drawn: what the router is asked, and the call (naming the candidate when drawn to it)."""
        run = self.book.run_for(model) if self.book is not None else None
        if run is not None and run.withdrawn:
            run = None
        route = RouteRequest(model=model)
        if run is None and not routing.revisions:
            return route, call  # most requests: no canary and no plan revisions, nothing to draw
        groups = self._groups(model, routing, run)
        group = choose_group(groups, exchange.request_id) if groups else None
        if group is not None:
            route.model, route.revision, route.canary = group.model, group.revision, group.canary
        if run is not None:
            drawn = group is not None and group.model == run.candidate_model
            exchange.canaried(run, drawn)
            if drawn:
                body = json.dumps({**json.loads(call.body), "model": run.candidate_model}).encode()
                call = RelayCall(call.path, body, call.stream, call.strip_usage, call.observer, call.assemble)
            elif run.shadow:
                self.shadow(run, call, payload)
        return route, call

    def _groups(self, model: str, routing: RoutingPolicy, run: CanaryRun | None) -> list[tuple[Group, float]]:
        if run is not None and run.percent > 0 and self.fleet.workers_for(run.candidate_model):
            share = run.percent / 100
            return [
                (Group(model, canary=model), 1 - share),
                (Group(run.candidate_model, canary=run.candidate_model), share),
            ]
        if routing.revisions:
            present = {n.hardware.plan_revision for n in self.fleet.workers_for(model)}
            return [(Group(model, revision=rev), share) for rev, share in routing.revisions if rev in present]
        return []

    # --- shadow --------------------------------------------------------------------------------------

    def shadow(self, run: CanaryRun, call: RelayCall, payload: dict[str, Any]) -> None:
        """Copy the request to ``run``'s candidate in the background; skipped when too many copies run already."""
        if len(self._shadows) >= MAX_SHADOWS or not self.fleet.workers_for(run.candidate_model):
            return
        body = json.dumps({**json.loads(call.body), "model": run.candidate_model}).encode()
        observer = ShadowObserver(run, call.observer.request_id + "-shadow", payload.get("stream") is True)
        copy = RelayCall(call.path, body, call.stream, False, observer, call.assemble)
        task = asyncio.create_task(self._send(copy, run, observer))
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _send(self, call: RelayCall, run: CanaryRun, observer: ShadowObserver) -> None:
        try:
            response = await self.relay.forward(call, RouteRequest(model=run.candidate_model))
            if isinstance(response, StreamingResponse):
                async for _ in response.body_iterator:
                    pass  # read and discarded: the copy's answer goes nowhere
        except GatewayError as err:  # no worker of the candidate could take the copy
            observer.ended(Outcome(err.status, "error"))
        except Exception:
            log.exception("the shadow copy %s to %s failed", observer.request_id, run.candidate_model)
            observer.ended(Outcome(500, "error"))
        finally:
            observer.release()


class ShadowObserver:
    """A shadow copy's bookkeeping: its worker held while it runs, its end counted on the candidate's side only."""

    def __init__(self, run: CanaryRun, request_id: str, streamed: bool) -> None:
        self.run = run
        self.request_id = request_id
        self.streamed = streamed
        self.started = time.perf_counter()
        self.lease: Lease | None = None
        self.done = False

    def routed(self, record: RouteRecord) -> None:
        pass

    def leased(self, lease: Lease) -> None:
        self.release()
        self.lease = lease

    def sent(self) -> None:
        pass

    def answered(self, upstream_s: float) -> None:
        pass

    def streaming(self, tokens_sent: int, node_id: str) -> None:
        pass

    def ended(self, outcome: Outcome) -> None:
        if self.done:
            return
        self.done = True
        self.release()
        if self.run.withdrawn:
            return
        latency_ms = int((time.perf_counter() - self.started) * 1000)
        self.run.candidate.add(
            error=is_fault(outcome.status, outcome.engine_failed),
            ttft_ms=outcome.ttft_ms,
            latency_ms=latency_ms,
            streamed=self.streamed,
        )

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None
