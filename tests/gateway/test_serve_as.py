"""``Gateway.serve_as``: a request served in process for a known key (a batch's line) takes the path of one from a client."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from opod.access.keytable import KeyEntry
from tests.gateway.test_relay import CHAT, Setup, join, setup, sim  # noqa: F401  (the fixtures)

CALLER = KeyEntry("k_batch", "api", "batch", "h" * 64)


async def test_a_line_is_relayed_and_recorded_under_its_key(setup: Setup, sim: str) -> None:  # noqa: F811
    join(setup.fleet, "here", "127.0.0.1:1")
    setup.local.attach("here", lambda model: sim if model == CHAT["model"] else None)
    response = await setup.gateway.serve_as(
        CALLER, "/v1/chat/completions", json.dumps(CHAT).encode(), "batch_x-1", "sheddable"
    )
    assert response.status_code == 200
    assert json.loads(bytes(response.body))["choices"][0]["message"]["content"]
    [row] = setup.usage.rows
    assert row.request_id == "batch_x-1" and row.ended["outcome"] == "ok"
    assert setup.gateway.stats.in_flight == 0, "the request ended, as a client's does"


async def test_the_routes_rules_and_the_keys_state_still_hold(setup: Setup, sim: str) -> None:  # noqa: F811
    join(setup.fleet, "here", "127.0.0.1:1")
    setup.local.attach("here", lambda model: sim if model == CHAT["model"] else None)
    bad = await setup.gateway.serve_as(
        CALLER, "/v1/chat/completions", json.dumps({"model": CHAT["model"]}).encode(), "b-2"
    )
    assert bad.status_code == 400 and "messages" in json.loads(bytes(bad.body))["error"]["message"]
    revoked = KeyEntry("k_gone", "api", "gone", "g" * 64, revoked=True)
    refused = await setup.gateway.serve_as(revoked, "/v1/chat/completions", json.dumps(CHAT).encode(), "b-3")
    assert refused.status_code == 401 and "revoked" in json.loads(bytes(refused.body))["error"]["message"]
    expired = KeyEntry("k_old", "api", "old", "o" * 64, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    assert (
        await setup.gateway.serve_as(expired, "/v1/chat/completions", json.dumps(CHAT).encode(), "b-4")
    ).status_code == 401
    unknown = await setup.gateway.serve_as(CALLER, "/v1/images/generations", b"{}", "b-5")
    assert unknown.status_code == 404
