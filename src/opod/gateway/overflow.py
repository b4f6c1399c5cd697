"""Where a request goes when its model cannot serve it here, and requests for a federation peer's model.

A model that cannot take a request (every slot taken past the admission hold, or no worker took it
before its first byte) goes down its fallbacks in order (:func:`opod.fleet.fallbacks.fallbacks_of`):
a model of this catalog that a worker serves, or ``PEER/MODEL``, a federation peer's model while the
peer is up; then to the mounted policy's fallback URL. The answer names where it was served in
``X-Opod-Fallback``. Nothing left: the refusal stands (503 with ``Retry-After``).

A request sent to a peer carries ``X-Llmgw-Hop``: the clusters it passed through, this one added.
A request that arrives with this cluster's id among them came round a loop and is refused with 508
(:meth:`Overflow.check_hops`), before anything is spent on it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from opod.fleet.fallbacks import PEER_MARK, fallbacks_of
from opod.fleet.federation import HOP_HEADER, TAGS_HEADER, Federation, PeerTarget
from opod.fleet.models import ModelRegistry
from opod.fleet.router import RouteRequest
from opod.fleet.state import Fleet
from opod.gateway.exchange import Exchange
from opod.gateway.relay import Relay, RelayCall
from opod.http.errors import LoopDetected, NoCapacity
from opod.snapshots.policy import Fallback, PolicyView

FALLBACK_HEADER = "X-Opod-Fallback"
HOP_KEY = HOP_HEADER.lower().encode()


class Overflow:
    """A model's fallbacks and the federation's peers, as the gateway sends requests to them."""

    def __init__(self, models: ModelRegistry, fleet: Fleet, relay: Relay, federation: Federation | None) -> None:
        self.models = models
        self.fleet = fleet
        self.relay = relay
        self.federation = federation

    def check_hops(self, headers: dict[bytes, bytes]) -> str:
        """The hops a request arrived with (``""`` for most); :class:`LoopDetected` when this cluster is one."""
        hops = headers.get(HOP_KEY)
        if hops is None or self.federation is None:
            return ""
        text = hops.decode("latin-1")
        if self.federation.cluster in (hop.strip() for hop in text.split(",")):
            raise LoopDetected(self.federation.cluster, text)
        return text

    def peer_target(self, model: str) -> PeerTarget | None:
        """Where a request naming a peer's model (``PEER/MODEL``) goes now; ``None`` when it is no peer's."""
        if PEER_MARK not in model or self.federation is None:
            return None
        return self.federation.target(model)

    def peer_models(self) -> list[str]:
        """The peers' models a request may name now: those of peers that are up, not withdrawn."""
        return self.federation.offered() if self.federation is not None else []

    def is_peer_model(self, model: str) -> bool:
        return PEER_MARK in model and self.federation is not None and self.federation.knows(model)

    def available(self, model: str, policy: PolicyView | None) -> bool:
        """Whether ``model`` has somewhere to go when it cannot serve: a fallback, or the policy's URL."""
        known = self.models.active(model)
        return bool(known is not None and fallbacks_of(known)) or (
            policy is not None and policy.routing.fallback is not None
        )

    async def fall_back(
        self,
        call: RelayCall,
        model: str,
        payload: dict[str, Any],
        exchange: Exchange,
        policy: PolicyView | None,
        refusal: NoCapacity,
        hops: str,
    ) -> Response:
        """``model`` could not serve the request: its fallbacks in order, then the policy's URL; else ``refusal``."""
        known = self.models.active(model)
        for alternative in fallbacks_of(known) if known is not None else []:
            if alternative == model:
                continue
            if PEER_MARK in alternative:
                target = self.peer_target(alternative)
                if target is None:
                    continue
                exchange.fell_back(alternative)
                try:
                    response = await self.to_peer(target, call, payload, exchange, hops)
                except NoCapacity:
                    continue
            else:
                if not self.fleet.serves(alternative):
                    continue
                # The usage row's route names the fallback; each attempt's routing record joins it.
                exchange.fell_back(alternative)
                body = json.dumps({**payload, "model": alternative}).encode()
                try:
                    response = await self.relay.forward(
                        RelayCall(call.path, body, call.stream, call.strip_usage, exchange, call.assemble),
                        RouteRequest(model=alternative),
                    )
                except NoCapacity:
                    continue
            response.headers[FALLBACK_HEADER] = alternative
            return response
        target_url = policy.routing.fallback if policy is not None else None
        if target_url is None:
            raise refusal
        exchange.fell_back(target_url.url)
        response = await self.relay.external(target_url, call, payload)
        response.headers[FALLBACK_HEADER] = target_url.url
        return response

    async def to_peer(
        self, target: PeerTarget, call: RelayCall, payload: dict[str, Any], exchange: Exchange, hops: str
    ) -> Response:
        """The request sent to a federation peer, as the peer names the model, with the hop (and tags) headers."""
        assert self.federation is not None  # a target comes from the federation
        cluster = self.federation.cluster
        extra = {HOP_HEADER: f"{hops}, {cluster}" if hops else cluster}
        if target.send_tags:
            extra[TAGS_HEADER] = f"cluster={cluster}" + (
                f",project={exchange.project_id}" if exchange.project_id else ""
            )
        return await self.relay.external(Fallback(target.base_url, target.upstream, target.key), call, payload, extra)
