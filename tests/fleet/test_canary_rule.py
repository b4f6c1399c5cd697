"""The canary's rollback rule on tallies a user could see on ``GET /canaries``: a time to the first token a few
milliseconds long on both sides is noise at whole milliseconds, not a slower candidate."""

from __future__ import annotations

from opod.contract.admin.catalog import CatalogCanary
from opod.fleet.canaries import TTFT_SLACK_MS, CanaryRun, judge


def served(stable_ms: int, candidate_ms: int, count: int = 60) -> CanaryRun:
    run = CanaryRun(model="chat", canary=CatalogCanary(model="chat-next", percent=50, min_requests=50))
    for _ in range(count):
        run.stable.add(error=False, ttft_ms=stable_ms, latency_ms=stable_ms + 5, streamed=True)
        run.candidate.add(error=False, ttft_ms=candidate_ms, latency_ms=candidate_ms + 5, streamed=True)
    return run


def test_a_candidate_slower_by_its_ratio_and_by_more_than_the_slack_is_rolled_back() -> None:
    verdict = judge(served(100, 100 + 2 * TTFT_SLACK_MS + 60))
    assert verdict is not None and verdict.rule == "ttft"
    assert verdict.numbers["ttft_ratio"] > 1.5 and "times, above the 1.5 allowed" in verdict.reason


def test_two_milliseconds_against_one_is_kept() -> None:
    assert judge(served(1, 2)) is None, "twice as slow, by one millisecond: noise"


def test_within_the_ratio_is_kept_whatever_the_difference() -> None:
    assert judge(served(1000, 1400)) is None


def test_too_few_requests_decide_nothing() -> None:
    assert judge(served(10, 900, count=20)) is None
