"""Canaries: a share of a model's requests sent to a candidate model, what each side served, and when to give up.

A model's canary is its definition's ``canary`` (``catalog.Canary``): the candidate (another model of
the catalog, which clients cannot name while it is one), the share of requests it takes, and the
limits it is held to. The definition is the one record of it; :class:`CanaryBook` follows the
definitions (:meth:`CanaryBook.sync`) and keeps, per canary, a :class:`CanaryRun`: the tallies of
both sides since the canary was last set or changed, so a canary a person changed is judged afresh.

A canary at 0 percent runs in shadow: each request of the model is copied to the candidate in the
background and its answer discarded, so the candidate is measured before it takes any share.

:func:`judge` is the one rule that rolls a candidate back: over at least ``min_requests`` of the
candidate's own requests (and as many of the stable model's), its error rate more than
``max_error_increase`` above the stable model's, or its mean time to the first token more than
``max_ttft_ratio`` times the stable model's and :data:`TTFT_SLACK_MS` longer. Too few requests, or no time measured on a side, is no
verdict. Errors are the candidate's own faults (:func:`is_fault`), never a client's mistake.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from opod.contract.admin.catalog import CatalogCanary
from opod.contract.admin.models import CanarySide, CanaryStat
from opod.fleet.models import ModelRegistry

MIN_REQUESTS = 50
MAX_ERROR_INCREASE = 0.05
MAX_TTFT_RATIO = 1.5


def in_force(canary: CatalogCanary) -> CatalogCanary:
    """``canary`` with its defaults in force: a limit left out or zero is the spec's default."""
    return canary.model_copy(
        update={
            "percent": canary.percent or 0,
            "min_requests": canary.min_requests or MIN_REQUESTS,
            "max_error_increase": canary.max_error_increase or MAX_ERROR_INCREASE,
            "max_ttft_ratio": canary.max_ttft_ratio or MAX_TTFT_RATIO,
        }
    )


def canary_problems(canary: CatalogCanary) -> list[str]:
    """What is wrong with a canary's own fields (the candidate's existence is the service's to check)."""
    found: list[str] = []
    if not (canary.model or "").strip():
        found.append("model: name the candidate, a model of the catalog that takes the canary's share")
    if canary.percent is not None and not 0 <= canary.percent <= 100:
        found.append(f"percent: {canary.percent} is not between 0 and 100 (0 runs the candidate in shadow)")
    if canary.min_requests is not None and canary.min_requests < 0:
        found.append(f"min_requests: {canary.min_requests} cannot be negative (0 takes the default, 50)")
    if canary.max_error_increase is not None and not 0 <= canary.max_error_increase <= 1:
        found.append(f"max_error_increase: {canary.max_error_increase} is a share from 0 to 1 (0.05 is five points)")
    if canary.max_ttft_ratio is not None and canary.max_ttft_ratio < 0:
        found.append(f"max_ttft_ratio: {canary.max_ttft_ratio} cannot be negative (0 takes the default, 1.5)")
    return found


def is_fault(status: int, engine_failed: bool) -> bool:
    """Whether a request's end counts against the side that served it: an answer of 500 and up (no worker could
    serve it, it broke off, opod failed), or the engine's own 5xx that the client was told as a 400. A client's
    4xx and a client that left (499) are not."""
    return status >= 500 or engine_failed


TTFT_SLACK_MS = 20.0
"""How much longer the candidate's mean time to the first token must also be before its ratio counts: times are
whole milliseconds, so on an engine that answers in a few, one millisecond more is already a ratio of 1.5."""


@dataclass(slots=True)
class Side:
    """What one side of a canary served since the run began."""

    requests: int = 0
    errors: int = 0
    ttft_ms_total: float = 0.0
    ttft_count: int = 0
    latency_ms_total: float = 0.0
    latency_count: int = 0

    def add(self, *, error: bool, ttft_ms: int, latency_ms: int, streamed: bool) -> None:
        self.requests += 1
        self.errors += error
        if error:
            return  # a failure's timing says nothing of how fast the side answers
        if streamed:
            self.ttft_ms_total += ttft_ms
            self.ttft_count += 1
        elif not streamed:
            self.latency_ms_total += latency_ms
            self.latency_count += 1

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def ttft_ms(self) -> float | None:
        return self.ttft_ms_total / self.ttft_count if self.ttft_count else None

    def view(self) -> CanarySide:
        return CanarySide(
            requests=self.requests,
            errors=self.errors,
            ttft_ms=round(self.ttft_ms_total / self.ttft_count, 3) if self.ttft_count else 0.0,
            ttft_count=self.ttft_count,
            latency_ms=round(self.latency_ms_total / self.latency_count, 3) if self.latency_count else 0.0,
            latency_count=self.latency_count,
        )


_RUN_IDS = itertools.count(1)


@dataclass(slots=True, eq=False)
class CanaryRun:
    """One canary as set, and what both sides served since then."""

    model: str
    """The stable model: the one clients name."""
    canary: CatalogCanary
    """As in force (:func:`in_force`)."""
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    stable: Side = field(default_factory=Side)
    candidate: Side = field(default_factory=Side)
    id: int = field(default_factory=lambda: next(_RUN_IDS))
    withdrawn: bool = False
    """Its share is taken away (being taken out, rolled back or promoted): no request goes to the candidate."""

    @property
    def candidate_model(self) -> str:
        return self.canary.model or ""

    @property
    def percent(self) -> int:
        return self.canary.percent or 0

    @property
    def shadow(self) -> bool:
        """The candidate takes no share and gets a copy of each request instead."""
        return self.percent == 0

    def side(self, candidate: bool) -> Side:
        return self.candidate if candidate else self.stable

    def stat(self) -> CanaryStat:
        return CanaryStat(
            canary=self.candidate_model, since=self.since, stable=self.stable.view(), candidate=self.candidate.view()
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a candidate is rolled back, with the numbers."""

    rule: str
    """``errors`` or ``ttft``."""
    reason: str
    numbers: dict[str, float | int]


def judge(run: CanaryRun) -> Verdict | None:
    """The rollback rule over ``run``'s tallies; ``None`` while it keeps the candidate (or cannot decide yet)."""
    limits, stable, cand = run.canary, run.stable, run.candidate
    need = limits.min_requests or MIN_REQUESTS
    if cand.requests < need or stable.requests < need:
        return None  # too few of either side's own requests: no verdict
    counts: dict[str, float | int] = {
        "min_requests": need,
        "candidate_requests": cand.requests,
        "stable_requests": stable.requests,
    }
    allowed = limits.max_error_increase or MAX_ERROR_INCREASE
    increase = cand.error_rate - stable.error_rate
    if increase > allowed:
        numbers = {
            **counts,
            "candidate_errors": cand.errors,
            "stable_errors": stable.errors,
            "candidate_error_rate": round(cand.error_rate, 4),
            "stable_error_rate": round(stable.error_rate, 4),
            "max_error_increase": allowed,
        }
        return Verdict(
            "errors",
            f"the candidate {run.candidate_model} failed {cand.errors} of {cand.requests} requests "
            f"({cand.error_rate:.1%}) against {stable.errors} of {stable.requests} ({stable.error_rate:.1%}) "
            f"for {run.model}: {increase * 100:.1f} points more, above the {allowed * 100:.1f} allowed",
            numbers,
        )
    ratio_allowed = limits.max_ttft_ratio or MAX_TTFT_RATIO
    cand_ttft, stable_ttft = cand.ttft_ms, stable.ttft_ms
    if cand.ttft_count < need or stable.ttft_count < need or not cand_ttft or not stable_ttft:
        return None  # too few streamed answers to compare the first token's time
    ratio = cand_ttft / stable_ttft
    if ratio > ratio_allowed and cand_ttft - stable_ttft > TTFT_SLACK_MS:
        numbers = {
            **counts,
            "candidate_ttft_ms": round(cand_ttft, 1),
            "stable_ttft_ms": round(stable_ttft, 1),
            "candidate_ttft_count": cand.ttft_count,
            "stable_ttft_count": stable.ttft_count,
            "ttft_ratio": round(ratio, 3),
            "max_ttft_ratio": ratio_allowed,
        }
        return Verdict(
            "ttft",
            f"the candidate {run.candidate_model}'s mean time to the first token was {cand_ttft:.0f} ms over "
            f"{cand.ttft_count} streamed answers against {stable_ttft:.0f} ms over {stable.ttft_count} for "
            f"{run.model}: {ratio:.2f} times, above the {ratio_allowed:g} allowed",
            numbers,
        )
    return None


class CanaryBook:
    """Each model's canary run, following the definitions; the gateway records into it, the watcher judges it."""

    def __init__(self) -> None:
        self._runs: dict[str, CanaryRun] = {}
        """stable model → its run."""
        self._candidates: dict[str, str] = {}
        """candidate → the stable model it is a candidate of."""
        # The dicts' own ``get``s, bound again whenever :meth:`sync` swaps the dicts: both are asked on every
        # request's way, and a bound dict method is no Python call.
        self.run_for: Callable[[str], CanaryRun | None] = self._runs.get
        """``model``'s canary run, if it has a canary."""
        self.candidate_of: Callable[[str], str | None] = self._candidates.get
        """The stable model ``name`` is a candidate of, or ``None`` when it is no canary's candidate."""

    def sync(self, models: ModelRegistry) -> None:
        """Follow the definitions: a canary new or changed starts a fresh run, one gone ends its run."""
        runs: dict[str, CanaryRun] = {}
        for model in models:
            definition = model.definition
            if model.removed or definition is None or definition.canary is None:
                continue
            canary = in_force(definition.canary)
            run = self._runs.get(model.id)
            runs[model.id] = run if run is not None and run.canary == canary else CanaryRun(model.id, canary)
        self._runs = runs
        self._candidates = {run.candidate_model: name for name, run in runs.items()}
        self.run_for, self.candidate_of = self._runs.get, self._candidates.get

    def __iter__(self) -> Iterator[CanaryRun]:
        return iter(sorted(self._runs.values(), key=lambda run: run.model))
