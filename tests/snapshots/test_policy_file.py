"""The policy file: checked beyond its types, swapped whole, read through typed views."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opod.snapshots.policy import PolicyFile
from opod.snapshots.watch import FileWatcher, SnapshotError
from tests.snapshots.helpers import Events, eventually, write_atomic


def parse(policy: dict):
    return PolicyFile().parse(json.dumps(policy).encode())


def guardrail(id_: str = "pii", **extra: object) -> dict:
    return {"id": id_, "phase": "pre", "url": "http://127.0.0.1:9/check", "failOpen": False, **extra}


def test_an_empty_policy_is_the_old_behaviour() -> None:
    holder = PolicyFile()
    view = holder.view()
    assert holder.revision is None and holder.current().revision == ""
    assert view.routing.fallback is None and view.routing.revisions == () and view.routing.kv_saturation_pct == 0
    assert view.access_log is None and view.guardrails == () and view.max_snapshot_age_sec == 0
    assert view.admission.hold_ms == 0 and view.admission.for_class("critical").hold_ms == 0
    assert parse({}).routing == view.routing


def test_views_give_readers_typed_normalised_values() -> None:
    view = parse(
        {
            "revision": "policy-12",
            "routing": {
                "kvWeight": 2,
                "kvSaturationPct": 90,
                "prefixAffinity": True,
                "prefixBlockWeight": 0.5,
                "cacheIsolation": "team",
                "revisions": [{"revision": 7, "weight": 9}, {"revision": 8, "weight": 1}],
                "fallbackUrl": "https://fallback.example/v1/",
                "fallbackModel": "gpt-x",
                "fallbackKey": "sk-f",
            },
            "logging": {"accessLog": False},
            "guardrails": [guardrail("a"), guardrail("b", phase="post", timeoutMs=500)],
            "auth": {"maxSnapshotAgeSec": 300},
            "admission": {
                "holdMs": 2000,
                "maxHeld": 200,
                "classes": [{"name": "critical", "holdMs": 10000}, {"name": "sheddable", "maxShare": 0.25}],
            },
        }
    )
    r = view.routing
    assert (r.kv_weight, r.kv_saturation_pct, r.prefix_affinity, r.prefix_block_weight, r.cache_isolation) == (
        2.0,
        90,
        True,
        0.5,
        "team",
    )
    assert [(s.revision, round(s.share, 6)) for s in r.revisions] == [(7, 0.9), (8, 0.1)]
    assert (r.fallback.url, r.fallback.model, r.fallback.key) == ("https://fallback.example/v1", "gpt-x", "sk-f")
    assert view.access_log is False
    assert [g.timeout_ms for g in view.guardrails] == [2000, 500]  # the default filled in
    assert [g.id for g in view.guardrails_for("post")] == ["b"]
    assert view.max_snapshot_age_sec == 300
    assert view.admission.for_class("critical").hold_ms == 10000
    assert view.admission.for_class("sheddable").max_share == 0.25
    assert view.admission.for_class("standard").hold_ms == 2000  # no class entry: the policy-wide hold
    # Weights are shares: {90, 10} is the same split as {9, 1}.
    same = parse(
        {"routing": {"revisions": [{"revision": 7, "weight": 90}, {"revision": 8, "weight": 10}]}}
    ).routing.revisions
    assert [(s.revision, round(s.share, 6)) for s in same] == [(7, 0.9), (8, 0.1)]


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"routing": {"kvWeight": -1}}, "routing.kvWeight"),
        ({"routing": {"prefixBlockWeight": -0.5}}, "routing.prefixBlockWeight"),
        ({"routing": {"kvSaturationPct": 101}}, "routing.kvSaturationPct: 101 is outside 0..100"),
        ({"routing": {"kvSaturationPct": 90.5}}, "routing.kvSaturationPct: expected an integer"),
        (
            {"routing": {"revisions": [{"revision": 1, "weight": 0}, {"revision": 2, "weight": 0}]}},
            "routing.revisions: every weight is 0",
        ),
        (
            {"routing": {"revisions": [{"revision": 1, "weight": -1}, {"revision": 2, "weight": 3}]}},
            "routing.revisions[0].weight",
        ),
        (
            {"routing": {"revisions": [{"revision": 1, "weight": 1}, {"revision": 1, "weight": 3}]}},
            "routing.revisions[1].revision: revision 1 is listed twice",
        ),
        ({"routing": {"fallbackUrl": "ftp://x"}}, "routing.fallbackUrl"),
        ({"routing": {"fallbackUrl": "not a url"}}, "routing.fallbackUrl"),
        ({"routing": {"fallbackUrl": "http://x:99999"}}, "routing.fallbackUrl"),
        ({"routing": {"fallbackModel": "m"}}, "routing.fallbackModel is set but routing.fallbackUrl is empty"),
        ({"guardrails": [guardrail("a"), guardrail("a")]}, "guardrails[1].id: 'a' is also guardrails[0].id"),
        ({"guardrails": [guardrail("")]}, "guardrails[0].id: empty"),
        ({"guardrails": [guardrail(url="file:///etc/passwd")]}, "guardrails[0].url (id 'pii')"),
        ({"guardrails": [guardrail(timeoutMs=-5)]}, "guardrails[0].timeoutMs (id 'pii')"),
        (
            {"guardrails": [guardrail(timeoutMs=600000)]},
            "guardrails[0].timeoutMs (id 'pii'): 600000 is outside 0..60000",
        ),
        ({"guardrails": [guardrail(phase="during")]}, "guardrails.0.phase: 'during' is not one of"),
        ({"guardrails": [guardrail(headers={"X-A": "one\r\ntwo"})]}, "guardrails[0].headers.X-A (id 'pii')"),
        ({"guardrails": [guardrail(headers={"bad name": "v"})]}, "guardrails[0].headers (id 'pii'): 'bad name'"),
        ({"guardrails": [guardrail(authKey="k", headers={"Authorization": "Bearer x"})]}, "conflicts with authKey"),
        ({"auth": {"maxSnapshotAgeSec": -1}}, "auth.maxSnapshotAgeSec"),
        ({"admission": {"holdMs": -1}}, "admission.holdMs"),
        ({"admission": {"maxHeld": -3}}, "admission.maxHeld"),
        ({"admission": {"classes": [{"name": "critical", "maxShare": 1.5}]}}, "admission.classes[0].maxShare"),
        ({"admission": {"classes": [{"name": "critical"}, {"name": "critical"}]}}, "admission.classes[1].name"),
        ({"logging": {"accessLog": "yes"}}, "logging.accessLog: expected true or false"),
    ],
)
def test_a_bad_policy_names_the_field(policy: dict, field: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        parse(policy)
    assert field in str(caught.value)


def test_nan_weights_are_refused() -> None:
    with pytest.raises(SnapshotError, match="routing.kvWeight"):
        PolicyFile().parse(b'{"routing": {"kvWeight": NaN}}')


async def test_a_new_policy_applies_within_2_s_and_a_bad_one_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    holder, events = PolicyFile(), Events()
    seen = []
    holder.subscribe(lambda view: seen.append(view.revision))
    watcher = FileWatcher(path, holder, events)
    await watcher.start()
    try:
        write_atomic(path, {"revision": "p1", "routing": {"kvSaturationPct": 80}})
        assert await eventually(lambda: holder.revision == "p1") < 2.0
        before = holder.view()
        write_atomic(path, {"revision": "p2", "routing": {"kvSaturationPct": 180}})
        await eventually(lambda: events.of("policy.rejected"))
        assert holder.view() is before  # the very same object: nothing half-applied
        assert "routing.kvSaturationPct: 180 is outside 0..100" in events.of("policy.rejected")[0]["reason"]
        write_atomic(path, {"revision": "p3", "logging": {"accessLog": True}, "guardrails": [guardrail("g")]})
        assert await eventually(lambda: holder.revision == "p3") < 2.0
        assert holder.current().routing.kv_saturation_pct == 0 and holder.view().access_log is True
    finally:
        await watcher.stop()
    assert seen == ["", "p1", "p3"]
    assert events.of("policy.updated")[-1]["guardrails"] == ["g"]
