"""What the guardrails did to a request travels through the journal into its usage row, and survives a crash:
an ended request keeps its end's outcome, one in flight keeps what the ``pre`` guardrails decided."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from opod.ledger import Ledger
from opod.store import InvalidInput, Store
from tests.support.rows import usage_row

PRE_REWRITE = {
    "guard_action": "rewrite",
    "guard_policy": "pii",
    "guard_rule": "pre",
    "guard_category": "redacted",
    "guard_ms": 7,
}
POST_BLOCK = {
    "guard_action": "block",
    "guard_policy": "answers",
    "guard_rule": "post",
    "guard_category": "a card number",
    "guard_ms": 12,
}


def guard_of(store: Store, request_id: str) -> dict[str, object]:
    row = store.find_request(request_id)
    return {
        "guard_action": row.guard_action,
        "guard_policy": row.guard_policy,
        "guard_rule": row.guard_rule,
        "guard_category": row.guard_category,
        "guard_ms": row.guard_ms,
    }


def rewritten_then_blocked(ledger: Ledger, request_id: str, post: dict[str, object]) -> None:
    """A request a pre rule rewrote and a post rule then blocked (``post``: its guard fields), ended with the 400."""
    ticket = ledger.begin(
        request_id=request_id, api_key_id="k", user_id="", model="m", protocol="openai", details=PRE_REWRITE
    )
    ledger.end(
        ticket,
        outcome="error",
        prompt_tokens=3,
        completion_tokens=4,
        latency_ms=20,
        details={"status": 400, **post},
    )


async def test_the_end_carries_the_guard_outcome_and_overrides_the_starts(ledger: Ledger, store: Store) -> None:
    rewritten_then_blocked(ledger, "judged", POST_BLOCK)
    plain = ledger.begin(request_id="plain", api_key_id="k", user_id="", model="m", protocol="openai")
    ledger.end(plain, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=2, details={"status": 200})
    await ledger.flush()
    assert guard_of(store, "judged") == POST_BLOCK
    assert store.find_request("judged").status == 400
    assert guard_of(store, "plain") == {
        "guard_action": "",
        "guard_policy": "",
        "guard_rule": "",
        "guard_category": "",
        "guard_ms": 0,
    }


async def test_an_end_without_a_reason_does_not_keep_the_starts_reason(ledger: Ledger, store: Store) -> None:
    unexplained = {k: v for k, v in POST_BLOCK.items() if k != "guard_category"}  # the webhook gave no reason
    rewritten_then_blocked(ledger, "blocked", unexplained)
    await ledger.flush()
    assert guard_of(store, "blocked") == {**unexplained, "guard_category": ""}


def test_a_crash_keeps_the_guard_outcome_of_ended_and_interrupted_requests(
    store: Store, home: Path, open_ledger: Callable[..., Ledger]
) -> None:
    first = Ledger.open(store, home, keep=timedelta(days=1))
    first.begin(request_id="in-flight", api_key_id="k", user_id="", model="m", protocol="openai", details=PRE_REWRITE)
    ended = first.begin(request_id="ended", api_key_id="k", user_id="", model="m", protocol="openai")
    first.end(
        ended,
        outcome="error",
        prompt_tokens=0,
        completion_tokens=0,
        latency_ms=3,
        details={"status": 400, **POST_BLOCK},
    )
    first.journal.close()  # the process dies: one request in flight, one ended but not committed
    open_ledger()
    assert store.find_request("in-flight").outcome == "interrupted"
    assert guard_of(store, "in-flight") == PRE_REWRITE
    assert guard_of(store, "ended") == POST_BLOCK


async def test_odd_guard_values_are_cleaned_not_lost(ledger: Ledger, store: Store) -> None:
    ticket = ledger.begin(request_id="odd", api_key_id="k", user_id="", model="m", protocol="openai")
    ledger.end(
        ticket,
        outcome="ok",
        prompt_tokens=0,
        completion_tokens=0,
        latency_ms=1,
        details={"guard_action": "allow", "guard_policy": "p\x00ii", "guard_rule": "pre", "guard_ms": -4},
    )
    await ledger.flush()
    assert guard_of(store, "odd") == {
        "guard_action": "allow",
        "guard_policy": "pii",
        "guard_rule": "pre",
        "guard_category": "",
        "guard_ms": 0,
    }


def test_the_store_keeps_the_guard_columns_and_refuses_bad_ones(store: Store) -> None:
    store.append_ledger([usage_row("g1", **PRE_REWRITE)])
    assert guard_of(store, "g1") == PRE_REWRITE
    with pytest.raises(InvalidInput, match="guard_ms"):
        store.append_ledger([replace(usage_row("g2"), guard_ms=-1)])
    with pytest.raises(InvalidInput, match="guard_action"):
        store.append_ledger([replace(usage_row("g3"), guard_action=3)])  # type: ignore[arg-type]
