"""Budgets: reservation arithmetic, periods, the refusal's words and the crossing event (no processes)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from opod.gateway.budgets import (
    BudgetExceeded,
    Budgets,
    BudgetScope,
    period_bounds,
)
from opod.settings.schema import Budget, ClusterSettings, Price

ORG, TEAM, PROJECT = BudgetScope("org", "o_acme"), BudgetScope("team", "t_ml"), BudgetScope("project", "p_chat")


@dataclass
class Held:
    """A settings holder that swaps whole settings, as ``SettingsHolder`` does."""

    current: ClusterSettings = field(default_factory=ClusterSettings)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def budgets(
    *limits: Budget, spent: dict[str, int] | None = None, now: datetime | None = None
) -> tuple[Budgets, list, Clock]:
    events: list[tuple[str, str, dict]] = []
    clock = Clock(now or datetime(2026, 12, 2, 10, 0, tzinfo=UTC))
    settings = Held(
        ClusterSettings(prices={"*": Price(input_per_million=1, output_per_million=2)}, budgets=list(limits))
    )
    by_text = {"org:acme": ORG, "team:acme/ml": TEAM, "project:acme/ml/chat": PROJECT}

    def resolve(text: str) -> BudgetScope:
        return by_text[text]

    loaded = spent or {}
    b = Budgets(
        settings=settings,
        resolve=resolve,
        spent_since=lambda kind, ident, since: loaded.get(ident, 0),
        emit=lambda *e: events.append(e),
        clock=clock,
    )
    b.configure()
    return b, events, clock


def test_periods_are_utc_days_iso_weeks_and_calendar_months() -> None:
    at = datetime(2026, 12, 31, 23, 59, tzinfo=UTC)
    assert period_bounds("day", at) == (datetime(2026, 12, 31, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert period_bounds("week", at) == (
        datetime(2026, 12, 28, tzinfo=UTC),
        datetime(2027, 1, 4, tzinfo=UTC),
    )  # a Monday
    assert period_bounds("month", at) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert period_bounds("month", datetime(2026, 2, 10, tzinfo=UTC))[1] == datetime(2026, 3, 1, tzinfo=UTC)


def test_a_reservation_holds_until_settled_and_the_actual_cost_then_counts() -> None:
    b, _, _ = budgets(Budget(scope="team:acme/ml", period="day", micros=1000))
    first = b.reserve([PROJECT, TEAM, ORG], 600)
    with pytest.raises(BudgetExceeded):
        b.reserve([PROJECT, TEAM, ORG], 600)  # 600 held + 600 would pass 1000
    first.settle(100)
    assert b.spent("team", "t_ml", "day") == 100
    second = b.reserve([TEAM], 900)  # 100 spent + 900 = the budget exactly: allowed
    second.settle(900)
    second.settle(900)  # once only
    assert b.spent("team", "t_ml", "day") == 1000
    assert b.reserve([PROJECT, ORG], 10**9).micros == 0  # scopes without a budget hold nothing


def test_the_refusal_names_the_scope_and_the_period_and_retries_after_it_ends() -> None:
    b, events, _ = budgets(Budget(scope="project:acme/ml/chat", period="day", micros=500), spent={"p_chat": 450})
    with pytest.raises(BudgetExceeded) as refused:
        b.reserve([PROJECT], 100)
    err = refused.value
    assert (
        err.status == 429
        and err.code == "insufficient_quota"
        and (err.scope, err.period) == ("project:acme/ml/chat", "day")
    )
    assert "project:acme/ml/chat has used its daily budget of 500 micros (450 spent" in err.message
    assert "2026-12-03T00:00:00Z" in err.message
    assert err.headers["Retry-After"] == str(14 * 3600 + 1)
    assert events == [
        (
            "budget.crossed",
            "p_chat",
            {"scope": "project:acme/ml/chat", "period": "day", "budget_micros": 500, "spent_micros": 450},
        )
    ]
    with pytest.raises(BudgetExceeded):
        b.reserve([PROJECT], 100)
    assert len(events) == 1  # the first time in the period only


def test_spend_starts_over_when_the_period_ends() -> None:
    b, events, clock = budgets(Budget(scope="org:acme", period="day", micros=100))
    b.reserve([ORG], 100).settle(100)
    assert [e[0] for e in events] == ["budget.crossed"]  # the settled spend reached 100 %
    with pytest.raises(BudgetExceeded):
        b.reserve([ORG], 1)
    clock.now += timedelta(days=1)
    b.reserve([ORG], 60).settle(60)
    assert b.spent("org", "o_acme", "day") == 60


def test_concurrent_reservations_never_hold_more_than_the_budget() -> None:
    b, _, _ = budgets(Budget(scope="org:acme", period="month", micros=10_000))
    admitted, refused = [], []
    lock = threading.Lock()

    def one() -> None:
        try:
            r = b.reserve([PROJECT, TEAM, ORG], 300)
        except BudgetExceeded:
            with lock:
                refused.append(1)
            return
        with lock:
            admitted.append(r)

    threads = [threading.Thread(target=one) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 33 and len(refused) == 31  # 33 × 300 = 9,900 ≤ 10,000
    for r in admitted:
        r.settle(r.micros)
    assert b.spent("org", "o_acme", "month") == 9_900


def test_the_budgets_follow_the_settings_and_keep_their_spend() -> None:
    b, _, _ = budgets(Budget(scope="org:acme", period="month", micros=100))
    b.reserve([ORG], 80).settle(80)
    b.settings.current = ClusterSettings(
        budgets=[
            Budget(scope="org:acme", period="month", micros=1000),  # type: ignore[misc]
            Budget(scope="team:nowhere", micros=5),
        ]
    )
    assert b.active and b.budget_of("org", "o_acme") == (1000, "month") and b.spent("org", "o_acme", "month") == 80
    assert b.cost("m", 1000, 1000) == 0  # the new settings set no price
    b.settings.current = ClusterSettings()  # type: ignore[misc]
    assert not b.active and b.reserve([ORG], 10**12).micros == 0


def test_one_caller_s_scopes_meet_the_budgets_in_force_each_time() -> None:
    # The gateway passes each key's scopes as the same tuple, request after request: a budget set, changed or
    # dropped since its last request still applies to its next one.
    scopes = (TEAM, PROJECT)
    b, _, _ = budgets(Budget(scope="org:acme", period="month", micros=100))
    assert not b.governs(scopes) and b.reserve(scopes, 50).micros == 0
    b.settings.current = ClusterSettings(budgets=[Budget(scope="project:acme/ml/chat", period="day", micros=100)])
    assert b.governs(scopes) and not b.fits(scopes, 101) and b.fits(scopes, 100)
    b.reserve(scopes, 60)
    with pytest.raises(BudgetExceeded, match="project:acme/ml/chat"):
        b.reserve(scopes, 60)
    b.settings.current = ClusterSettings(budgets=[Budget(scope="team:acme/ml", period="day", micros=30)])
    with pytest.raises(BudgetExceeded, match="team:acme/ml"):
        b.reserve(scopes, 31)
    b.settings.current = ClusterSettings()
    assert not b.governs(scopes) and b.reserve(scopes, 10**12).micros == 0


def test_cost_in_micros_is_tokens_times_the_price_per_million() -> None:
    b, _, _ = budgets()
    b.settings.current = ClusterSettings(  # type: ignore[misc]
        prices={
            "m": Price(input_per_million=0.5, output_per_million=1.5),
            "free": Price(),
            "*": Price(input_per_million=9),
        }
    )
    assert b.cost("m", 1000, 200) == 800
    assert b.cost("free", 10**6, 10**6) == 0


def test_what_a_request_is_priced_at() -> None:
    b, _, _ = budgets()
    assert b.cost("any", 1_000_000, 500_000) == 2_000_000  # the "*" price: 1 + 2 × 0.5 per million, in micros
