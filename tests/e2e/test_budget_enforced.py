"""A budget enforced before the engine: 64 concurrent requests against a small budget on a real leader.

Each request's most likely cost is reserved at admission and settled at its end, so the burst
spends at most one reservation past the budget, and every refused request got 429 naming the
scope and the period, with ``Retry-After``, before any engine saw it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
BURST = 64
MAX_TOKENS = 8
PRICE = 1000  # per million tokens, in and out: 1,000 micros a token
# What the gateway reserves for the prompt below: its size estimate (2 tokens) and the template's
# 8 tokens per message and 8 more (opod.gateway.budgets.reserved_prompt), plus max_tokens.
RESERVATION = (2 + 16 + MAX_TOKENS) * PRICE
BUDGET = 5 * RESERVATION


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("budget")
    leader = Leader(root / "leader")
    worker = sim_worker(
        leader, root / "worker", "n_budget", OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 1.0, "output_max": MAX_TOKENS})
    )
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        for path, body in (
            ("/api/v1/orgs", {"name": "acme"}),
            ("/api/v1/teams", {"name": "ml", "in": "acme"}),
            ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ):
            status, answer = leader.admin("POST", path, body)
            assert status == 201, answer
        settings = (
            f"prices:\n  '*': {{input_per_million: {PRICE}, output_per_million: {PRICE}}}\n"
            f"budgets:\n  - scope: project:acme/ml/chat\n    period: month\n    micros: {BUDGET}\n"
        )
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": settings})
        assert status == 200, answer
        leader.wait_served(MODEL, timeout=60)
        yield leader
    finally:
        worker.stop()
        leader.stop()


async def burst(url: str, secret: str) -> list[tuple[int, str, str, str]]:
    """(status, error code, message, Retry-After) of each of BURST requests sent at once."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=secret, max_retries=0, timeout=60)

    async def one() -> tuple[int, str, str, str]:
        try:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "work"}], max_tokens=MAX_TOKENS
            )
            return 200, "", "", ""
        except openai.APIStatusError as err:
            error = err.body if isinstance(err.body, dict) else {}
            return (
                err.status_code,
                str(error.get("code", "")),
                str(error.get("message", "")),
                err.response.headers.get("retry-after", ""),
            )

    try:
        return await asyncio.gather(*(one() for _ in range(BURST)))
    finally:
        await client.close()


def test_a_burst_never_overshoots_the_budget_by_more_than_one_reservation(leader: Leader) -> None:
    status, key = leader.admin("POST", "/api/v1/keys", {"name": "burst", "project": "acme/ml/chat"})
    assert status == 201 and isinstance(key, dict), key
    answers = asyncio.run(burst(leader.url, key["secret"]))

    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert served and refused and len(served) + len(refused) == BURST, sorted({a[:2] for a in answers})
    for _, code, message, retry_after in refused:
        assert code == "insufficient_quota"
        assert "project:acme/ml/chat has used its monthly budget" in message and "retry then" in message
        assert int(retry_after) > 0

    def project_usage() -> dict | None:
        status, rows = leader.admin("GET", "/api/v1/usage?by=project")
        assert status == 200 and isinstance(rows, list)
        return next((r for r in rows if r.get("requests") == BURST), None)

    spent = wait_until(project_usage, 15, "every request's usage row")
    assert spent["errors"] == len(refused)
    assert 0 < spent["cost_micros"] <= BUDGET + RESERVATION, (spent, len(served))
    assert spent["budget_micros"] == BUDGET and spent["budget_period"] == "month"

    # The refused requests are the export's Limited ones; they cost nothing.
    status, _, rows = http("GET", leader.admin_url + "/api/v1/usage/export?format=json&by=project", key=leader.key)
    assert status == 200 and isinstance(rows, list)
    assert sum(r["Limited"] for r in rows) == len(refused) and sum(r["Requests"] for r in rows) == BURST

    # The first time the project passed its budget this month is an event.
    def crossed() -> list[dict]:
        status, _, page = http("GET", leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=leader.key)
        assert status == 200 and isinstance(page, dict)
        return [e for e in page.get("events") or [] if e.get("type") == "budget.crossed"]

    [event] = wait_until(crossed, 15, "the budget.crossed event")
    assert event["data"]["scope"] == "project:acme/ml/chat" and event["data"]["budget_micros"] == BUDGET
