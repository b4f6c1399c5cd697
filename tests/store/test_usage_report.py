"""The usage reports: totals per tenancy level, a scope's spend, and the export by period, on both databases."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from opod.store import InvalidInput, Store
from opod.store.usage import NewUsage
from opod.store.usage_report import chunks, dimensions

T = datetime(2026, 11, 30, 22, 30, tzinfo=UTC)


def row(entry: str, ts: datetime = T, **changes: object) -> NewUsage:
    base = NewUsage(
        entry=entry,
        request_id=entry,
        ts=ts,
        api_key_id="k_1",
        user_id="u_1",
        model="m",
        protocol="openai",
        prompt_tokens=10,
        completion_tokens=20,
        latency_ms=5,
        ttft_ms=1,
        outcome="ok",
        node_id="n1",
        project_id="p_chat",
        team_id="t_ml",
        org_id="o_acme",
        cost_micros=100,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.fixture
def filled(store: Store) -> Store:
    store.append_ledger(
        [
            row("a"),  # Nov 30, 22:30; c and d are on Dec 1
            row("b", T + timedelta(hours=1), api_key_id="k_2", outcome="error", cost_micros=0),
            row("c", T + timedelta(hours=2), project_id="p_web", model="n", cost_micros=7),
            row(
                "d",
                T + timedelta(hours=2),
                outcome="error",
                route_json='{"limited":"budget"}',
                prompt_tokens=0,
                completion_tokens=0,
                cost_micros=0,
            ),
            row("e", T, project_id="", team_id="", org_id="", api_key_id="k_admin"),  # a key of no project
        ]
    )
    return store


def test_totals_per_level_count_each_request_once_and_leave_out_rows_of_no_project(filled: Store) -> None:
    by_project = {t.id: t for t in filled.usage_by_scope("project", T - timedelta(hours=1))}
    assert set(by_project) == {"p_chat", "p_web"}
    chat = by_project["p_chat"]
    assert (chat.keys, chat.requests, chat.prompt_tokens, chat.completion_tokens, chat.cost_micros, chat.errors) == (
        2,
        3,
        20,
        40,
        100,
        2,
    )
    assert chat.last_at == T + timedelta(hours=2)
    [org] = filled.usage_by_scope("org", T - timedelta(hours=1))
    assert (org.id, org.requests, org.cost_micros) == ("o_acme", 4, 107)
    assert [t.requests for t in filled.usage_by_scope("team", T + timedelta(minutes=90))] == [2]
    with pytest.raises(InvalidInput, match="by: 'user' is not one of org, team, project"):
        filled.usage_by_scope("user", T)


def test_a_scope_spend_is_summed_by_its_column(filled: Store) -> None:
    assert filled.usage_spent_since("org", "o_acme", T - timedelta(days=1)) == 107
    assert filled.usage_spent_since("project", "p_web", T) == 7
    assert filled.usage_spent_since("key", "k_admin", T) == 100
    assert filled.usage_spent_since("team", "t_ml", T + timedelta(hours=3)) == 0


def test_the_export_buckets_rows_by_period_and_dimension(filled: Store) -> None:
    start, end = T - timedelta(days=1), T + timedelta(days=1)
    days = [r for a, b in chunks("day", start, end) for r in filled.usage_export_chunk("day", ["project"], a, b)]
    assert [(r.period.day, r.dims, r.requests, r.errors, r.limited, r.cost_micros) for r in days] == [
        (30, {"project": ""}, 1, 0, 0, 100),
        (30, {"project": "p_chat"}, 2, 1, 0, 100),
        (1, {"project": "p_chat"}, 1, 1, 1, 0),
        (1, {"project": "p_web"}, 1, 0, 0, 7),
    ]
    hours = [r for a, b in chunks("hour", start, end) for r in filled.usage_export_chunk("hour", [], a, b)]
    assert [(r.period.hour, r.requests) for r in hours] == [(22, 2), (23, 1), (0, 2)]
    assert sum(r.requests for r in hours) == 5
    months = [
        r for a, b in chunks("month", start, end) for r in filled.usage_export_chunk("month", ["model", "key"], a, b)
    ]
    assert [(r.period.month, r.dims["model"], r.dims["key"], r.requests) for r in months] == [
        (11, "m", "k_1", 1),
        (11, "m", "k_2", 1),
        (11, "m", "k_admin", 1),
        (12, "m", "k_1", 1),
        (12, "n", "k_1", 1),
    ]


def test_chunks_meet_at_period_boundaries_and_dimensions_are_checked() -> None:
    start = datetime(2026, 1, 15, 10, 20, tzinfo=UTC)
    pieces = list(chunks("day", start, datetime(2026, 3, 2, tzinfo=UTC)))
    assert pieces[0] == (start, datetime(2026, 2, 1, tzinfo=UTC)) and pieces[-1][1] == datetime(2026, 3, 2, tzinfo=UTC)
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert len(list(chunks("hour", start, start + timedelta(days=3)))) == 4
    assert dimensions("org, Team,model,org") == ["org", "team", "model"]
    with pytest.raises(InvalidInput, match="'region' is not a dimension"):
        dimensions("org,region")
