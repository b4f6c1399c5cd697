"""A paired comparison: a candidate scored against the model it would replace, case by case, on the same cases.

Two separate scores say little when the cases are few; pairs say which cases the candidate does
better or worse on. Only a case both runs answered makes a pair: a case either side failed to
answer is listed as missing, never counted as a loss or a win. No decision is taken on fewer than
``min_pairs`` pairs, on runs of different suites, or on a run that did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from opod.store.evals import EvalRunRecord

DECISIONS = ("better", "same", "worse", "insufficient")
DEFAULT_MARGIN = 0.05
"""How far the weighed mean of the differences may fall before the candidate is worse (or rise to be better)."""
TIE = 1e-9


@dataclass(frozen=True, slots=True)
class Pair:
    case: str
    baseline: float
    candidate: float
    weight: float

    @property
    def outcome(self) -> str:
        """``win``, ``loss`` or ``tie``, for the candidate."""
        delta = self.candidate - self.baseline
        return "tie" if abs(delta) <= TIE else "win" if delta > 0 else "loss"


@dataclass(frozen=True, slots=True)
class Comparison:
    decision: str
    """One of :data:`DECISIONS`; ``insufficient`` when the evidence does not allow one."""
    reason: str
    """Why, in words, with the numbers."""
    pairs: tuple[Pair, ...] = ()
    missing: tuple[str, ...] = ()
    """Cases without a pair: one side (or both) got no answer, or only one run asked them."""
    baseline_score: float = 0.0
    candidate_score: float = 0.0
    """Each side's weighed mean over the pairs only."""

    @property
    def wins(self) -> int:
        return sum(p.outcome == "win" for p in self.pairs)

    @property
    def losses(self) -> int:
        return sum(p.outcome == "loss" for p in self.pairs)

    @property
    def ties(self) -> int:
        return sum(p.outcome == "tie" for p in self.pairs)

    @property
    def delta(self) -> float:
        return self.candidate_score - self.baseline_score


def _unfinished(run: EvalRunRecord, side: str) -> str:
    if run.state != "done":
        return f"the {side} run {run.id} is {run.state}" + (f": {run.error}" if run.error else "")
    return ""


def compare_runs(
    baseline: EvalRunRecord, candidate: EvalRunRecord, *, min_pairs: int, margin: float = DEFAULT_MARGIN
) -> Comparison:
    """Pair the two runs' cases by id and decide; each run with its cases (:meth:`EvalsRepo.get_eval_run`)."""
    if min_pairs < 1:
        raise ValueError(f"min_pairs must be 1 or more, not {min_pairs}")
    why = _unfinished(baseline, "baseline") or _unfinished(candidate, "candidate")
    if not why and baseline.suite_hash != candidate.suite_hash:
        why = f"the runs asked different suites ({baseline.suite} {baseline.suite_hash[:12]}, {candidate.suite} {candidate.suite_hash[:12]})"
    if why:
        return Comparison("insufficient", why)
    theirs = {c.case_id: c for c in baseline.results}
    ours = {c.case_id: c for c in candidate.results}
    pairs: list[Pair] = []
    missing: list[str] = []
    for case_id in [*theirs, *(c for c in ours if c not in theirs)]:
        before, after = theirs.get(case_id), ours.get(case_id)
        if before is None or after is None or before.error or after.error:
            missing.append(case_id)
            continue
        pairs.append(Pair(case_id, before.score, after.score, after.weight))
    weight = sum(p.weight for p in pairs)
    base = sum(p.baseline * p.weight for p in pairs) / weight if weight else 0.0
    cand = sum(p.candidate * p.weight for p in pairs) / weight if weight else 0.0
    found = Comparison("insufficient", "", tuple(pairs), tuple(missing), base, cand)
    tally = f"{found.wins} wins, {found.losses} losses, {found.ties} ties over {len(pairs)} pairs"
    if missing:
        tally += f"; {len(missing)} cases without a pair ({', '.join(missing[:5])}{', …' if len(missing) > 5 else ''})"
    if len(pairs) < min_pairs:
        reason = f"{len(pairs)} cases answered by both, fewer than the {min_pairs} a decision needs; {tally}"
        return _with(found, "insufficient", reason)
    change = f"candidate {cand:.3f} against {base:.3f} ({cand - base:+.3f}, margin {margin:.3f}); {tally}"
    if cand - base < -margin:
        return _with(found, "worse", change)
    if cand - base > margin:
        return _with(found, "better", change)
    return _with(found, "same", change)


def _with(found: Comparison, decision: str, reason: str) -> Comparison:
    return Comparison(decision, reason, found.pairs, found.missing, found.baseline_score, found.candidate_score)
