"""A budget enforced before the engine: 64 requests released at once against a small budget, on every ``/v1``
endpoint, through ``opod up`` with the real llama-server (SmolLM2-135M-Instruct and its own chat template) and the
real embedding model.

Each request's cost is reserved at admission as an upper bound (its prompt's tokens, the template's counted by a
worker, each prompt of a list, each choice's ``max_tokens``) and settled at its end, so a burst spends at most one
reservation past the budget however the requests race; every refused request got 429 naming the scope and the
period, with ``Retry-After``, before any engine saw it. The prompts are real text of different lengths, and the
reservation compared with is the one the gateway states in its refusals ("could cost up to N").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.support.opod_process import Leader, http, wait_until

pytestmark = pytest.mark.engine

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
BURST = 64
PRICE = 1000  # per million tokens, in and out: 1,000 micros a token
BUDGET = 200_000  # a handful of these requests
SUBJECTS = ["the sea", "a red fox in the snow", "bread", "the last train home", "rain on a tin roof", "chess"]

Call = Callable[[openai.OpenAI, int], object]


def subject(i: int) -> str:
    return f"{SUBJECTS[i % len(SUBJECTS)]} (number {i})"


ENDPOINTS: dict[str, Call] = {
    "chat": lambda c, i: c.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": f"Write a line about {subject(i)}."}],
        max_tokens=8,
    ),
    "completions": lambda c, i: c.completions.create(
        model=CHAT, prompt=[f"A story about {subject(i)}:", "Once upon a time", f"Facts about {subject(i + 1)}:"]
    ),
    "responses": lambda c, i: c.responses.create(model=CHAT, input=f"Tell me about {subject(i)}.", max_output_tokens=8),
    "embeddings": lambda c, i: c.embeddings.create(
        model=EMBED, input=[f"A sentence about {subject(i)}.", "The quick brown fox jumps over the lazy dog."]
    ),
}


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    home: Path = tmp_path_factory.mktemp("budget") / "home"
    leader = Leader(home)
    try:
        leader.wait_served(CHAT, EMBED, timeout=150)
        steps = [("/api/v1/orgs", {"name": "acme"}), ("/api/v1/teams", {"name": "ml", "in": "acme"})]
        steps += [("/api/v1/projects", {"name": name, "in": "acme/ml"}) for name in ENDPOINTS]
        for path, body in steps:
            status, answer = leader.admin("POST", path, body)
            assert status == 201, answer
        budgets = "".join(
            f"  - scope: project:acme/ml/{name}\n    period: month\n    micros: {BUDGET}\n" for name in ENDPOINTS
        )
        settings = f"prices:\n  '*': {{input_per_million: {PRICE}, output_per_million: {PRICE}}}\nbudgets:\n{budgets}"
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": settings})
        assert status == 200, answer
        yield leader
    finally:
        if leader.process.proc.poll() is None:
            leader.process.stop()


def burst(url: str, secret: str, call: Call) -> list[tuple[int, str, str, str]]:
    """(status, error code, message, Retry-After) of each of BURST requests, released together by a barrier."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0, timeout=300)
    gate = threading.Barrier(BURST)
    answers: list[tuple[int, str, str, str]] = [(0, "", "", "")] * BURST

    def one(i: int) -> None:
        gate.wait()
        try:
            call(client, i)
            answers[i] = (200, "", "", "")
        except openai.APIStatusError as err:
            error = err.body if isinstance(err.body, dict) else {}
            answers[i] = (
                err.status_code,
                str(error.get("code", "")),
                str(error.get("message", "")),
                err.response.headers.get("retry-after", ""),
            )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    return answers


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_burst_never_overshoots_the_budget_by_more_than_one_reservation(leader: Leader, endpoint: str) -> None:
    scope = f"project:acme/ml/{endpoint}"
    status, key = leader.admin("POST", "/api/v1/keys", {"name": f"burst-{endpoint}", "project": f"acme/ml/{endpoint}"})
    assert status == 201 and isinstance(key, dict), key
    answers = burst(leader.url, key["secret"], ENDPOINTS[endpoint])

    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert served and refused and len(served) + len(refused) == BURST, sorted({a[:3] for a in answers})
    reservations = []
    for _, code, message, retry_after in refused:
        assert code == "insufficient_quota"
        assert f"{scope} has used its monthly budget" in message and "retry then" in message
        assert int(retry_after) > 0
        found = re.search(r"could cost up to (\d+)", message)
        assert found, message
        reservations.append(int(found.group(1)))

    def project_usage() -> dict | None:
        status, rows = leader.admin("GET", "/api/v1/usage?by=project")
        assert status == 200 and isinstance(rows, list)
        return next(
            (r for r in rows if r.get("name") == f"acme / ml / {endpoint}" and r.get("requests") == BURST), None
        )

    spent = wait_until(project_usage, 30, f"every usage row of {scope}")
    assert spent["errors"] == len(refused)
    assert 0 < spent["cost_micros"] <= BUDGET + max(reservations), (spent, len(served), max(reservations))
    assert spent["budget_micros"] == BUDGET and spent["budget_period"] == "month"

    # The refused requests are the export's Limited ones; they cost nothing.
    status, _, rows = http("GET", leader.admin_url + "/api/v1/usage/export?format=json&by=project", key=leader.key)
    assert status == 200 and isinstance(rows, list)
    mine = [r for r in rows if r.get("Project") == spent["id"]]
    assert sum(r["Limited"] for r in mine) == len(refused) and sum(r["Requests"] for r in mine) == BURST

    # The first time the project passed its budget this month is an event.
    def crossed() -> list[dict]:
        status, _, page = http("GET", leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=leader.key)
        assert status == 200 and isinstance(page, dict)
        return [e for e in page.get("events") or [] if e.get("type") == "budget.crossed"]

    events = wait_until(lambda: [e for e in crossed() if e["data"]["scope"] == scope], 15, "the budget.crossed event")
    assert len(events) == 1 and events[0]["data"]["budget_micros"] == BUDGET
