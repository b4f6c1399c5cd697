"""Choosing the worker for a request, from in-memory state only.

A worker's score is its load (requests this leader has in flight there, plus
the engine's own queue, plus ``kvWeight`` × its KV-cache use) minus
``prefixBlockWeight`` × the leading blocks of the request its engine already
holds. A worker at or above ``kvSaturationPct`` goes behind every worker with
headroom. For engines that report no cache events, the sticky prefix pin
(``prefixAffinity``) stands in for the block credit, and bridges the second
before a new prefix's events reach the leader. Workers that tie take
turns in a fixed rotation, so equal workers share the load and the choice is
deterministic for a given sequence of requests. A canary revision, when the
policy splits traffic, narrows the candidates to that revision's workers.

:class:`Router` holds what the choice remembers between requests (the block index, the pins,
the rotation); the leader makes one, and the relay calls it per attempt.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opod.fleet.affinity import AffinityTable, prefix_key
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet, NodeState

G = TypeVar("G")

PIN_CREDIT = 1.0
"""What the sticky pin is worth, in requests of load, on a worker that reports no cache events."""
SATURATED = 1e9
"""Added to the score of a worker at ``kvSaturationPct``: it goes behind every worker with headroom."""

RouteRecord = dict[str, str | int | float]
"""How a request was routed (:meth:`Decision.record`, then the gateway's admission class and fallback): the
``X-Opod-Route`` header and the usage row's ``route``."""


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    kv_weight: float = 0.0
    kv_saturation_pct: float = 0.0
    prefix_affinity: bool = False
    prefix_block_weight: float = 0.0
    revisions: tuple[tuple[int, float], ...] = ()
    """(plan revision, share) pairs; shares sum to 1; empty = no split."""


@dataclass(slots=True)
class RouteRequest:
    model: str
    hashes: Sequence[str] = ()
    """The request's chained block hashes, when computed (prefix routing)."""
    pin_key: str | None = None
    """The sticky pin's key; when not given, made from ``payload`` by :meth:`pin` the first time it is needed."""
    revision: int | None = None
    """The plan revision chosen for this request, once; retries stay in it."""
    canary: str | None = None
    """The model's canary group chosen for this request (``model`` is then that group's model), recorded as ``canary``."""
    payload: dict[str, Any] | None = None

    def pin(self) -> str | None:
        """The sticky pin's key, made once and only when asked: the pin is read and written only for
        requests whose prefix the index does not place, and making the key costs a dump and a hash."""
        if self.pin_key is None and self.payload is not None:
            self.pin_key = prefix_key(self.model, self.payload) or ""
            self.payload = None
        return self.pin_key or None


@dataclass(slots=True)
class Decision:
    node: NodeState
    reason: str
    """``prefix`` (held blocks decided), ``pin`` (the sticky pin decided), ``load``, or ``only`` (one candidate)."""
    blocks: int = 0
    of_blocks: int = 0
    load: float = 0.0
    queue: int = 0
    revision: int | None = None
    canary: str | None = None
    """The model's canary group this request was drawn into (the stable model's name or the candidate's)."""
    pin_key: str | None = None
    """The sticky pin's key (:meth:`RouteRequest.pin`) when the chosen worker holds none of the request's blocks:
    :meth:`Router.served` pins it there."""

    def record(self) -> RouteRecord:
        out: RouteRecord = {
            "worker": self.node.id,
            "reason": self.reason,
            "load": round(self.load, 2),
            "queue": self.queue,
        }
        if self.of_blocks:
            out["blocks"] = f"{self.blocks}/{self.of_blocks}"
        if self.revision is not None:
            out["canary"] = self.revision
        elif self.canary is not None:
            out["canary"] = self.canary
        return out


def choose_group(groups: Sequence[tuple[G, float]], request_id: str) -> G | None:
    """The canary group of a request: a share-weighted draw fixed by its id, so a retry stays in its group.

    The one rule for every split of a model's traffic: the mounted policy's plan revisions and a model's
    canary (:mod:`opod.fleet.canaries`) both draw here. Groups with no share are never drawn; ``None`` when
    none has one."""
    kept = [(group, share) for group, share in groups if share > 0]
    if not kept:
        return None
    total = sum(share for _, share in kept)
    point = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big") / 2**64 * total
    for group, share in kept:
        point -= share
        if point < 0:
            return group
    return kept[-1][0]


def choose_revision(revisions: Sequence[tuple[int, float]], request_id: str, present: Collection[int]) -> int | None:
    """The plan revision of a request (:func:`choose_group`); revisions with no live worker are skipped."""
    return choose_group([(rev, share) for rev, share in revisions if rev in present], request_id)


class Router:
    """Chooses the worker for each attempt, and learns where a prefix went once it was served."""

    __slots__ = ("_turns", "fleet", "index", "pins")

    def __init__(self, fleet: Fleet, index: PrefixIndex | None = None, pins: AffinityTable | None = None) -> None:
        self.fleet = fleet
        self.index = index
        """Which worker holds which prefix blocks (the engines' cache events)."""
        self.pins = pins
        """The sticky pins of prefixes no engine has reported yet."""
        self._turns: dict[str, itertools.count[int]] = {}
        """Each model's rotation among workers that tie."""

    def pick(
        self, request: RouteRequest, policy: RoutingPolicy = RoutingPolicy(), exclude: Collection[str] = ()
    ) -> Decision | None:
        """The best live worker holding the model, skipping ``exclude``; ``None`` when none can serve."""
        candidates = self.fleet.workers_for(request.model, time.monotonic())
        if exclude:
            candidates = [n for n in candidates if n.id not in exclude]
        if request.revision is not None:
            group = [n for n in candidates if n.hardware.plan_revision == request.revision]
            candidates = group or candidates
        if not candidates:
            return None
        index, pins = self.index, self.pins
        held = (
            index.leading_blocks(request.hashes)
            if index is not None and request.hashes and policy.prefix_block_weight
            else {}
        )
        key = request.pin() if pins is not None and policy.prefix_affinity and not held else None
        pinned = pins.get(key) if key and pins is not None else None
        best: list[NodeState] = []
        best_score = float("inf")
        least = len(request.hashes)  # becomes the fewest leading blocks any candidate holds
        kv_weight, saturation, block_weight = (
            policy.kv_weight / 100.0,
            policy.kv_saturation_pct,
            policy.prefix_block_weight,
        )
        for node in candidates:  # the hot loop: plain arithmetic and one lookup
            sample = node.load
            score: float = node.in_flight
            if sample is not None:
                score += sample.queue_depth + kv_weight * sample.kv_used_pct
                if saturation and sample.kv_used_pct >= saturation:
                    score += SATURATED
            if held:
                credit = held.get(node.id, 0)
                score -= block_weight * credit
                if credit < least:
                    least = credit
            elif node.id == pinned:
                score -= PIN_CREDIT  # no worker reports holding this prefix (no events, or not yet): the pin decides
            if score < best_score:
                best, best_score = [node], score
            elif score == best_score:
                best.append(node)
        if len(best) == 1:
            node = best[0]
        else:
            rotation = self._turns.setdefault(request.model, itertools.count())
            node = best[next(rotation) % len(best)]
        sample = node.load
        queue, kv = (sample.queue_depth, sample.kv_used_pct) if sample is not None else (0, 0.0)
        load = node.in_flight + queue + policy.kv_weight * kv / 100.0
        blocks = held.get(node.id, 0)
        if not blocks and held and pins is not None and policy.prefix_affinity:
            key = request.pin()  # the index placed the prefix elsewhere: served pins it where it goes
        if len(candidates) == 1:
            reason = "only"
        elif blocks > least:
            reason = "prefix"
        elif node.id == pinned:
            reason = "pin"
        else:
            reason = "load"
        return Decision(
            node,
            reason,
            blocks,
            len(request.hashes) if held or request.hashes else 0,
            load,
            queue,
            request.revision,
            request.canary,
            pin_key=None if blocks else key,
        )

    def served(self, decision: Decision, request: RouteRequest, policy: RoutingPolicy) -> None:
        """The decided worker answered: its blocks are fresh, and a prefix the index did not place is pinned there."""
        if decision.blocks and self.index is not None:
            self.index.touch(decision.node.id, request.hashes[: decision.blocks])
        elif decision.pin_key and policy.prefix_affinity and self.pins is not None:
            self.pins.pin(decision.pin_key, decision.node.id)
