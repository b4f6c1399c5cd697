"""A request's attribution (project, team, org) and cost travel through the journal and survive a crash."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from opod.ledger import Ledger
from opod.store import Store


async def test_an_ended_request_keeps_its_project_team_org_and_cost(ledger: Ledger, store: Store) -> None:
    ticket = ledger.begin(
        request_id="r",
        api_key_id="k_1",
        user_id="u_1",
        model="m",
        protocol="openai",
        project_id="p_chat",
        team_id="t_ml",
        org_id="o_acme",
    )
    ledger.end(ticket, outcome="ok", prompt_tokens=3, completion_tokens=4, latency_ms=5, cost_micros=1234)
    plain = ledger.begin(request_id="plain", api_key_id="k_2", user_id="", model="m", protocol="openai")
    ledger.end(plain, outcome="ok", prompt_tokens=1, completion_tokens=1, latency_ms=1)
    await ledger.flush()
    rows = {r.request_id: r for r in store.usage_after(0, 10)}
    assert (rows["r"].project_id, rows["r"].team_id, rows["r"].org_id, rows["r"].cost_micros) == (
        "p_chat",
        "t_ml",
        "o_acme",
        1234,
    )
    assert (rows["plain"].project_id, rows["plain"].cost_micros) == ("", 0)


def test_a_crash_replays_attributed_rows_and_interrupted_ones_keep_their_project(
    store: Store, home: Path, open_ledger: Callable[..., Ledger]
) -> None:
    first = Ledger.open(store, home, keep=timedelta(days=1))
    done = first.begin(
        request_id="done",
        api_key_id="k",
        user_id="u",
        model="m",
        protocol="openai",
        project_id="p",
        team_id="t",
        org_id="o",
    )
    first.end(done, outcome="ok", prompt_tokens=1, completion_tokens=2, latency_ms=3, cost_micros=99)
    first.begin(
        request_id="cut",
        api_key_id="k",
        user_id="u",
        model="m",
        protocol="openai",
        project_id="p",
        team_id="t",
        org_id="o",
    )
    first.journal.close()  # the process dies: nothing committed, the journal left as it is
    open_ledger()  # the next start replays it
    rows = {r.request_id: r for r in store.usage_after(0, 10)}
    assert (rows["done"].outcome, rows["done"].project_id, rows["done"].org_id, rows["done"].cost_micros) == (
        "ok",
        "p",
        "o",
        99,
    )
    assert (rows["cut"].outcome, rows["cut"].project_id, rows["cut"].team_id) == ("interrupted", "p", "t")
