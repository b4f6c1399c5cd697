"""A list is reserved as the sum of its items on every ``/v1`` route that takes one, through a gateway built as the
leader builds it, on a simulated engine (which also reranks). The real engine's lists: tests/e2e/test_metering.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from opod.access.keytable import KeyEntry
from opod.fleet.local import LocalEngines
from opod.fleet.state import Fleet
from opod.gateway.app import Gateway
from opod.gateway.budgets import Budgets
from opod.http.nodeclient import WorkerClient
from opod.security.signer import Signer
from opod.settings.schema import Budget, ClusterSettings, Price
from tests.gateway.test_relay import MODEL, Usage, gateway_on, join, sim  # noqa: F401  (the fixture)

PROBE = KeyEntry("k_probe", "api", "probe", "p" * 64, project_id="p_probe")
"""A key whose project has a budget of 0: every request is refused, saying what it was reserved for."""
OPEN = KeyEntry("k_open", "api", "open", "o" * 64, project_id="p_open")


@dataclass
class Settings:
    current: ClusterSettings


@dataclass
class Served:
    gateway: Gateway
    usage: Usage


@pytest.fixture
async def served(sim: str) -> AsyncIterator[Served]:  # noqa: F811
    fleet, local, usage = Fleet(), LocalEngines(), Usage()
    join(fleet, "here", "127.0.0.1:1")
    local.attach("here", lambda model: sim if model == MODEL else None)
    workers = WorkerClient(lambda _: "node-token", Signer)
    settings = ClusterSettings(
        prices={"*": Price(input_per_million=1, output_per_million=1000)},
        budgets=[Budget(scope="project:p_probe", micros=0)],  # type: ignore[call-arg]
    )
    gateway = gateway_on(fleet, local, usage, workers, budgets=Budgets(settings=Settings(settings)))
    yield Served(gateway, usage)
    await gateway.guardrails.close()
    await workers.close()


async def reserved(served: Served, path: str, body: dict) -> tuple[int, int]:
    """(prompt tokens, completion tokens) the request was reserved for: its 429 says so, in micros."""
    answer = await served.gateway.serve_as(PROBE, path, json.dumps({"model": MODEL, **body}).encode(), "probe")
    assert answer.status_code == 429, bytes(answer.body)
    found = re.search(r"could cost up to (\d+)", json.loads(bytes(answer.body))["error"]["message"])
    assert found
    return int(found.group(1)) % 1000, int(found.group(1)) // 1000


async def used(served: Served, path: str, body: dict) -> dict:
    answer = await served.gateway.serve_as(OPEN, path, json.dumps({"model": MODEL, **body}).encode(), "open")
    assert answer.status_code == 200, bytes(answer.body)
    return json.loads(bytes(answer.body))["usage"]


@pytest.mark.parametrize(
    ("path", "name", "items", "extra", "simulated"),
    [
        # The simulator answers one prompt per request; llama-server's answer to a list is in the e2e test.
        ("/v1/completions", "prompt", ["Once upon a time", "The sea", "1, 2, 3,"], {"max_tokens": 4}, False),
        ("/v1/completions", "prompt", [[1, 2, 3], [4, 5]], {"max_tokens": 4, "n": 2}, False),
        ("/v1/embeddings", "input", ["The sea is calm.", "A cat sat.", "Prices rose in March."], {}, True),
        ("/v1/embeddings", "input", [[101, 2023, 102], [101, 7592, 2088, 102]], {}, False),
        (
            "/v1/rerank",
            "documents",
            ["A cat sat on the mat.", "Dogs bark.", "The sea is calm."],
            {"query": "cats"},
            True,
        ),
    ],
)
async def test_a_list_is_reserved_as_the_sum_of_its_items_and_never_below_what_it_spends(
    served: Served, path: str, name: str, items: list, extra: dict, simulated: bool
) -> None:
    each = [await reserved(served, path, {name: [item] if name == "documents" else item, **extra}) for item in items]
    whole = await reserved(served, path, {name: items, **extra})
    assert whole == (sum(p for p, _ in each), sum(c for _, c in each))
    if isinstance(items[0], list):  # token ids: their count is known exactly
        assert whole[0] >= sum(len(item) for item in items)
    if simulated:
        spent = await used(served, path, {name: items, **extra})
        assert 0 < spent["prompt_tokens"] <= whole[0] and spent.get("completion_tokens", 0) <= whole[1]
