"""The manager-facing types: /loadz, streams, capabilities, and the auth and policy files."""

from __future__ import annotations

import json

import pytest

from opod.contract import adminapi as a
from opod.contract.features import FEATURE_KEYS, frozen_routes
from opod.contract.wire import WireError


def test_loadz_always_carries_kv_busy_workers_and_never_a_fake_zero_for_unknowns() -> None:
    body = a.Load(workers=3, reporting=3, kv_used_pct=71, kv_busy_workers=1.6).to_wire()
    assert body["kv_busy_workers"] == 1.6
    assert "kv_busy_workers" in a.Load().to_wire()
    for unknown in ("prefix_index", "ttft_p50_ms", "ttft_p95_ms", "engines_unhealthy", "engine_issue"):
        assert unknown not in body
    with_index = a.Load(prefix_index=a.PrefixIndex()).to_wire()
    assert with_index["prefix_index"] == {"workers_reporting": 0, "blocks": 0}


def test_load_reads_both_the_sdk_and_the_always_present_core_shapes() -> None:
    core = a.Load.from_wire(
        '{"ttft_p50_ms":0,"ttft_p95_ms":0,"engines_unhealthy":0,"engine_issue":"","kv_busy_workers":0}'
    )
    assert core.ttft_p95_ms == 0 and core.prefix_index is None


def test_usage_and_events_pages() -> None:
    page = a.UsageBatch(
        events=[
            a.UsageEvent(
                id=7, ts="2026-10-31T12:00:00Z", data=a.UsageData(api_key_id="k_cp_alice", model="m", outcome="ok")
            )
        ],
        next=7,
        more=False,
    )
    body = page.to_wire()
    assert body["events"][0]["type"] == "usage"
    assert "boot" not in body and "ttft_ms" not in body["events"][0]["data"]
    assert body["events"][0]["data"]["cost_usd"] == 0
    assert a.UsageBatch.from_wire(json.dumps(body)) == page
    assert a.UsageBatch().to_wire()["events"] is None
    events = a.EventsBatch.from_wire(
        '{"events":[{"id":1,"type":"node.new_kind","subject":"n","ts":"t","data":{"x":[1]}}],"next":1,"more":true,"boot":9}'
    )
    assert events.events[0].data == {"x": [1]} and events.boot == 9


def test_capabilities_list_the_frozen_routes_and_feature_keys() -> None:
    routes = frozen_routes()
    assert len(routes) == 28
    assert routes[0] == a.Route(method="GET", path="/healthz")
    assert routes[-1] == a.Route(method="POST", path="/v1/rerank")
    assert len(FEATURE_KEYS) == len(set(FEATURE_KEYS)) == 51
    caps = a.Capabilities(contract=a.CONTRACT_VERSION, routes=routes, features={"usage_stream": True})
    body = caps.to_wire()
    assert body["engines"] == [] and body["contract"] == "v1"
    frozen_routes().append(a.Route(method="GET", path="/x"))
    assert len(frozen_routes()) == 28


def test_the_auth_file_from_the_readme_recipe() -> None:
    text = json.dumps(
        {
            "revision": "2026-10-31T12:00:00Z#7",
            "requireKeys": True,
            "issuedAt": "2026-10-31T12:00:00Z",
            "keys": [
                {
                    "id": "alice-laptop",
                    "name": "Alice's laptop",
                    "hash": "ab" * 32,
                    "expiresAt": "2027-01-31T00:00:00Z",
                    "class": "standard",
                    "team": "search",
                    "rpmLimit": 10,
                }
            ],
            "revokedKeys": ["bob-old"],
        }
    )
    snap = a.AuthSnapshot.from_wire(text)
    assert snap.require_keys and snap.keys[0].admission_class == "standard" and snap.keys[0].team == "search"
    assert snap.revoked_keys == ["bob-old"]
    body = snap.to_wire()
    assert "rpmLimit" not in body["keys"][0]
    assert list(body) == ["revision", "requireKeys", "keys", "revokedKeys", "issuedAt"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"nodeMtls": "sometimes"}, "nodeMtls: 'sometimes' is not one of"),
        ({"keys": [{"id": "a", "class": "vip"}]}, "keys.0.class: 'vip' is not one of"),
        ({"requireKeys": "yes"}, "requireKeys: expected true or false"),
    ],
)
def test_a_bad_auth_file_names_the_field(body: dict, words: str) -> None:
    with pytest.raises(WireError, match=words):
        a.AuthSnapshot.from_wire(body)


def test_an_empty_policy_changes_nothing_and_writes_the_go_shape() -> None:
    assert a.PolicySnapshot().to_json() == '{"revision":"","routing":{},"logging":{},"guardrails":null}'


def test_policy_omitzero_pointer_and_revision_weights() -> None:
    pol = a.PolicySnapshot(
        revision="policy-12",
        routing=a.PolicyRouting(
            kv_weight=2,
            kv_saturation_pct=90,
            prefix_affinity=True,
            revisions=[a.RevisionWeight(revision=7, weight=9), a.RevisionWeight(revision=8, weight=1)],
        ),
        logging=a.PolicyLogging(access_log=False),
        admission=a.PolicyAdmission(
            hold_ms=2000,
            max_held=200,
            classes=[
                a.PolicyAdmissionClass(name="critical", hold_ms=10000),
                a.PolicyAdmissionClass(name="sheddable", max_share=0.25),
            ],
        ),
    )
    body = pol.to_wire()
    assert body["routing"]["kvWeight"] == 2 and body["routing"]["revisions"][1] == {"revision": 8, "weight": 1}
    assert body["logging"] == {"accessLog": False}
    assert "auth" not in body
    assert body["admission"]["classes"][1] == {"name": "sheddable", "maxShare": 0.25}
    assert a.PolicySnapshot.from_wire(pol.to_json()) == pol
    assert '"kvWeight":2,' in pol.to_json()


def test_a_bad_guardrail_phase_is_refused_with_the_allowed_words() -> None:
    with pytest.raises(
        WireError, match=r"guardrails\.0\.phase: 'middle' is not one of 'pre', 'post' or 'logging_only'"
    ):
        a.PolicySnapshot.from_wire('{"guardrails":[{"id":"g","phase":"middle","url":"http://x"}]}')
