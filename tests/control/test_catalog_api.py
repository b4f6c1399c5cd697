"""The cluster's catalog through ``/api/v1/models`` and ``/api/v1/presets`` on a leader built in the test's process, as an
operator uses it (and ``opod model``, a client of it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.ports import free_port
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, opod_cli, wait_until

MINUTE = 60_000_000_000

FULL: dict[str, Any] = {
    "name": "chat-big",
    "aliases": ["gpt-4o", "big"],
    "description": "The team's chat model, for long answers.",
    "source": "acme/chat-big-GGUF/chat-big-Q4_K_M.gguf",
    "profiles": [
        {
            "name": "h100",
            "engine": "vllm",
            "engine_version": "0.11",
            "gpu_class": "H100-80GB",
            "tp": 2,
            "pp": 1,
            "gpus_per_node": 2,
            "args": ["--max-model-len", "32768"],
            "env": {"VLLM_LOGGING_LEVEL": "INFO"},
            "min_memory_gb": 64,
            "cpu_cores": 8,
            "min_disk_gb": 100,
            "node_selector": {"llmgw.io/site": "par1"},
            "power_watts": 1400.5,
            "keep_within": "rack",
            "weight": 2.5,
            "priority": 10,
            "startup_timeout": 10 * MINUTE,
            "kv_events": True,
        },
        {"name": "cpu", "engine": "llamacpp", "min_memory_gb": 48, "cpu_cores": 16},
        {
            "name": "ampere",
            "engine": "sglang",
            "gpu": {"min_compute_capability": 8.0, "min_memory_gb": 40},
            "nodes": 2,
            "tp": 4,
        },
    ],
    "scaling": {
        "min": 1,
        "max": 3,
        "idle_timeout": 30 * MINUTE,
        "prewarm": 15 * MINUTE,
        "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "19:00", "min": 2, "max": 3}],
    },
    "class": "critical",
    "owner": "team:acme/ml",
    "license": {"id": "apache-2.0", "commercial": True},
    "adapters": [{"name": "legal", "source": "acme/legal-lora", "scale": 0.8, "owner": "project:acme/ml/legal"}],
    "max_loaded_adapters": 4,
    "fallbacks": ["smollm2-135m-instruct"],
    "canary": {"model": "chat-big-next", "percent": 10, "min_requests": 50},
    "eval": {"suite": "smoke", "min_score": 0.8},
    "routing_profile": "interactive",
    "slo": {"TTFTp99": 2_000_000_000, "TPOTp99": 100_000_000},
    "context_length": 32768,
    "max_output": 4096,
    "capabilities": {"tools": True, "vision": False},
    "query_prefix": "query: ",
    "origin": {"repo": "acme/chat-big", "revision": "abc123"},
}


def contains(whole: Any, part: Any) -> bool:
    """Every field of ``part`` is in ``whole`` with the same value (lists item by item)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(k in whole and contains(whole[k], v) for k, v in part.items())
    if isinstance(part, list):
        return (
            isinstance(whole, list)
            and len(whole) == len(part)
            and all(contains(w, p) for w, p in zip(whole, part, strict=True))
        )
    return whole == part


def admin(
    leader: Leader, method: str, path: str, body: object | None = None, actor: str | None = None
) -> tuple[int, Any]:
    if actor is None:
        return leader.admin(method, path, body)
    return leader.admin(method, path, body or {}, headers={"X-Llmgw-Actor": actor})


SCOPES: dict[str, str] = {}
"""The owners ``FULL`` and the tests name by path (``team:acme/ml``) → the ``kind:ID`` they are kept and answered as."""


def tenancy(leader: Leader) -> None:
    """The part of the tenancy tree the models' owners name: acme, its team ml, and ml's projects legal and chat."""
    for kind, name, parent, path in [
        ("org", "acme", None, "acme"),
        ("team", "ml", "acme", "acme/ml"),
        ("project", "legal", "acme/ml", "acme/ml/legal"),
        ("project", "chat", "acme/ml", "acme/ml/chat"),
    ]:
        status, item = leader.admin("POST", f"/api/v1/{kind}s", {"name": name, **({"in": parent} if parent else {})})
        assert status == 201, item
        SCOPES[f"{kind}:{path}"] = f"{kind}:{item['id']}"


def by_id(definition: dict[str, Any]) -> dict[str, Any]:
    """``definition`` as it is kept: its owners as ``kind:ID``."""
    adapters = [{**a, "owner": SCOPES[a["owner"]]} for a in definition["adapters"]]
    return {**definition, "owner": SCOPES[definition["owner"]], "adapters": adapters}


def listing(leader: Leader) -> dict[str, dict]:
    status, rows = leader.admin("GET", "/api/v1/models")
    assert status == 200, rows
    return {row["name"]: row for row in rows}


def test_a_whole_definition_is_kept_shown_back_with_defaults_and_survives_a_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    leader = Leader(home, default_models=True)
    try:
        tenancy(leader)
        status, body = leader.admin("POST", "/api/v1/models", FULL)
        assert (status, body) == (200, {"added": "chat-big"})
        status, shown = leader.admin("GET", "/api/v1/models/chat-big")
        assert status == 200 and contains(shown, by_id(FULL)), shown
        assert shown["profiles"][2] | {} == FULL["profiles"][2] | {"name": "ampere", "pp": 1, "gpus_per_node": 4}, (
            "defaults filled in"
        )
        by_alias = leader.admin("GET", "/api/v1/models/gpt-4o")[1]
        assert by_alias == shown, "a model is found by an alias too"

        row = listing(leader)["chat-big"]
        assert contains(
            row,
            {
                "name": "chat-big",
                "aliases": ["gpt-4o", "big"],
                "description": FULL["description"],
                "source": FULL["source"],
                "min_replicas": 1,
                "max_replicas": 3,
                "ready_replicas": 0,
                "profiles": ["h100", "cpu", "ampere"],
                "memory_gb": 64,
                "cpu_cores": 8,
                "class": "critical",
                "owner": SCOPES["team:acme/ml"],
                "fallbacks": ["smollm2-135m-instruct"],
                "origin": {"repo": "acme/chat-big", "revision": "abc123"},
            },
        ), row
        assert any("H100-80GB" in w for w in row["warnings"]), "a GPU class no node has is a warning, not a refusal"
        assert all(value is not None for value in row.values()), "absent fields are left out, never null"

        outside = {
            "name": "outside",
            "external": {"url": "https://api.example.com/v1", "model": "gpt-4.1"},
            "description": "overflow",
        }
        assert leader.admin("POST", "/api/v1/models", outside)[0] == 200
        assert listing(leader)["outside"]["external"] == "api.example.com/gpt-4.1"

        leader = leader.restart()  # raises if the leader did not stop cleanly
        status, again = leader.admin("GET", "/api/v1/models/chat-big")
        assert (status, again) == (200, shown), "every field comes back after a restart"
        assert contains(leader.admin("GET", "/api/v1/models/outside")[1], outside)
        assert {"smollm2-135m-instruct", "all-minilm-l6-v2", "chat-big", "outside"} <= set(listing(leader))
    finally:
        leader.stop()


BAD: list[tuple[dict[str, Any], int, str]] = [
    ({"name": "chat-big"}, 409, "name: model 'chat-big' is already in the catalog"),
    (
        {"name": "other", "source": "acme/x", "aliases": ["big"]},
        409,
        "aliases[0]: 'big' is already a name of model 'chat-big'",
    ),
    ({"name": "gpt-4o", "source": "acme/x"}, 409, "name: 'gpt-4o' is already a name of model 'chat-big'"),
    (
        {"name": "other", "source": "acme/x", "profiles": [{"engine": "tensorrt"}]},
        400,
        "profiles[0].engine: 'tensorrt' is not an engine",
    ),
    (
        {"name": "other", "source": "acme/x", "profiles": [{"engine": "vllm", "tp": 0}]},
        400,
        "profiles[0].tp: 0 is below 1",
    ),
    ({"name": "other", "source": "acme/x", "class": "gold"}, 400, "class: 'gold' is not a capacity class"),
    ({"name": "other", "source": "acme/x", "scaling": {"min": 3, "max": 1}}, 400, "scaling: min 3 is above max 1"),
    ({"name": "other", "source": "acme/x", "scaling": {"idle_timeout": "10m"}}, 400, "scaling.idle_timeout"),
    (
        {"name": "other", "source": "acme/x", "scaling": {"idle_timeout": -1}},
        400,
        "scaling.idle_timeout: a duration in nanoseconds cannot be negative",
    ),
    (
        {"name": "other", "source": "acme/x", "scaling": {"schedule": [{"from": "8am", "to": "17:00"}]}},
        400,
        "scaling.schedule[0].from",
    ),
    ({"name": "other", "source": "acme/x", "owner": "acme"}, 400, "owner: 'acme' is not a scope"),
    (
        {"name": "other", "source": "acme/x", "profiles": [{"engine": "vllm", "gpu_class": "H100 80GB"}]},
        400,
        "profiles[0].gpu_class",
    ),
    ({"name": "other", "source": "acme/x", "colour": "blue"}, 400, "colour"),
    ({"name": "Other Model", "source": "acme/x"}, 400, "name: 'Other Model' must be lower-case"),
    ({"name": "no-such-thing"}, 400, "source: 'no-such-thing' is not in the catalog"),
    ({"name": "other", "external": {"url": "ftp://x"}}, 400, "external.url"),
]


@pytest.fixture(scope="module")
def catalog_leader(tmp_path_factory: pytest.TempPathFactory):
    leader = Leader(tmp_path_factory.mktemp("catalog") / "home", default_models=True)
    tenancy(leader)
    assert leader.admin("POST", "/api/v1/models", FULL)[0] == 200
    yield leader
    leader.stop()


@pytest.mark.parametrize(("body", "status", "message"), BAD, ids=[m.split(":")[0] for _, _, m in BAD])
def test_a_bad_definition_is_refused_naming_the_field_and_nothing_is_kept(
    catalog_leader: Leader, body: dict, status: int, message: str
) -> None:
    before = kept(catalog_leader)
    answer, error = catalog_leader.admin("POST", "/api/v1/models", body)
    assert answer == status and set(error) == {"error"} and message in error["error"], error
    assert kept(catalog_leader) == before


def kept(leader: Leader) -> dict[str, dict]:
    """Every model's definition as the catalog keeps it (the listing's states are the reconciler's, and move)."""
    return {name: leader.admin("GET", f"/api/v1/models/{name}")[1] for name in listing(leader)}


def test_a_body_of_the_wrong_type_is_an_error_view(catalog_leader: Leader) -> None:
    status, error = catalog_leader.admin("POST", "/api/v1/models", ["chat-big"])
    assert status == 400 and set(error) == {"error"}


def test_scale_class_owner_and_resources_change_the_definition(catalog_leader: Leader) -> None:
    leader = catalog_leader
    assert leader.admin("POST", "/api/v1/models/chat-big/scale", {"min": 2}) == (
        200,
        {"model": "chat-big", "min": 2, "max": 2, "idle_timeout": 30 * MINUTE, "on_demand": False},
    ), "a max left out follows min"
    assert leader.admin("POST", "/api/v1/models/chat-big/scale", {"min": 0, "max": 2, "idle_timeout": 20 * MINUTE}) == (
        200,
        {"model": "chat-big", "min": 0, "max": 2, "idle_timeout": 20 * MINUTE, "on_demand": True},
    )
    status, error = leader.admin("POST", "/api/v1/models/chat-big/scale", {"min": 5, "max": 1})
    assert status == 400 and "scaling: min 5 is above max 1" in error["error"]
    assert leader.admin("GET", "/api/v1/models/chat-big")[1]["scaling"]["max"] == 2, (
        "a refused change is not half-applied"
    )

    assert leader.admin("POST", "/api/v1/models/chat-big/class", {"class": "opportunistic"}) == (
        200,
        {"model": "chat-big", "class": "opportunistic"},
    )
    assert leader.admin("POST", "/api/v1/models/chat-big/class", {"class": ""}) == (
        200,
        {"model": "chat-big", "class": "opportunistic"},
    ), "empty goes back to what the scaling implies: on demand is opportunistic"
    assert leader.admin("POST", "/api/v1/models/chat-big/class", {"class": "vip"})[0] == 400

    assert leader.admin("POST", "/api/v1/models/chat-big/owner", {"owner": "project:acme/ml/chat"}) == (
        200,
        {"model": "chat-big", "owner": SCOPES["project:acme/ml/chat"]},
    )
    status, error = leader.admin("POST", "/api/v1/models/chat-big/owner", {"owner": "team:a/b/c"})
    assert status == 400 and "owner: 'team:a/b/c' is not a scope" in error["error"]
    assert leader.admin("POST", "/api/v1/models/chat-big/owner", {"owner": ""}) == (200, {"model": "chat-big"}), (
        "empty is shared"
    )

    status, model = leader.admin(
        "POST", "/api/v1/models/chat-big/resources", {"profile": "cpu", "memory_gb": 56, "cpu_cores": 12}
    )
    assert status == 200 and model["name"] == "chat-big"
    assert [(p["name"], p.get("min_memory_gb"), p.get("cpu_cores")) for p in model["profiles"]] == [
        ("h100", 64, 8),
        ("cpu", 56, 12),
        ("ampere", None, None),
    ]
    status, error = leader.admin("POST", "/api/v1/models/chat-big/resources", {"profile": "tpu", "memory_gb": 1})
    assert status == 404 and "profile: 'tpu' is not a profile of 'chat-big'" in error["error"]
    assert leader.admin("POST", "/api/v1/models/nope/scale", {"min": 1})[0] == 404

    row = listing(leader)["chat-big"]
    assert (row["min_replicas"], row["max_replicas"], row["class"], "owner" in row) == (0, 2, "opportunistic", False)


def test_the_built_in_default_cannot_be_removed_but_an_added_model_can(catalog_leader: Leader) -> None:
    status, error = catalog_leader.admin("DELETE", "/api/v1/models/smollm2-135m-instruct")
    assert (
        status == 409
        and "scale it to 0" in error["error"]
        and "/api/v1/models/smollm2-135m-instruct/scale" in error["error"]
    )
    assert "smollm2-135m-instruct" in listing(catalog_leader)
    assert (
        catalog_leader.admin(
            "POST", "/api/v1/models", {"name": "gone-soon", "source": "acme/gone", "scaling": {"min": 0}}
        )[0]
        == 200
    )
    assert catalog_leader.admin("DELETE", "/api/v1/models/gone-soon") == (200, {"removed": "gone-soon"})
    assert catalog_leader.admin("GET", "/api/v1/models/gone-soon")[0] == 404
    assert "gone-soon" not in listing(catalog_leader)


INVENTORY = """
gpus:
  - name: NVIDIA H100 80GB HBM3
    class: H100-80GB
    memory_gb: 80
    compute_capability: "9.0"
memory_gb: 16
"""


def test_presets_fit_the_fleet_are_added_by_hand_or_by_themselves_and_a_removal_declines(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "home")
    worker = None
    try:
        status, view = leader.admin("GET", "/api/v1/presets")
        assert status == 200 and view["auto"] is False and len(view["presets"]) >= 48
        assert all(p["blocked"].startswith("presets.auto is off") and not p["fits"] for p in view["presets"])

        (tmp_path / "inventory.yaml").write_text(INVENTORY)
        args = [
            "join",
            leader.url,
            "--token",
            leader.node_token(),
            "--engine",
            "sim",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--inventory",
            str(tmp_path / "inventory.yaml"),
        ]
        from tests.support.opod_process import clean_env

        worker = OpodProcess(args, tmp_path / "worker", env=clean_env(tmp_path / "worker", OPOD_NODE_ID="gpu-1"))

        def presets() -> dict[str, dict]:
            return {p["name"]: p for p in leader.admin("GET", "/api/v1/presets")[1]["presets"]}

        wait_until(lambda: presets()["smollm2-135m-instruct"]["fits"], 60, "a preset to fit the worker that joined")
        shown = presets()
        assert "cpu" in shown["smollm2-135m-instruct"]["fits_classes"]
        assert shown["gpt-oss-120b"]["fits_classes"] == ["H100-80GB"], "a card with the memory the preset needs"
        assert (
            shown["smollm2-135m-instruct"]["licence"]["id"] == "apache-2.0"
            and shown["smollm2-135m-instruct"]["makes"] == "text"
        )
        too_big = next(p for p in shown.values() if not p["fits"])
        assert too_big["in_catalog"] is False

        assert admin(leader, "POST", "/api/v1/presets/smollm2-135m-instruct", actor="ops@example") == (
            200,
            {"added": "smollm2-135m-instruct"},
        )
        added = presets()["smollm2-135m-instruct"]
        assert (added["in_catalog"], added["added_by"], added.get("declined"), "blocked" in added) == (
            True,
            "ops@example",
            False,
            False,
        )
        assert "added_at" in added and "smollm2-135m-instruct" in listing(leader)
        assert leader.admin("POST", "/api/v1/presets/smollm2-135m-instruct")[0] == 409
        assert leader.admin("POST", "/api/v1/presets/no-such-preset")[0] == 404

        assert leader.admin("DELETE", "/api/v1/models/smollm2-135m-instruct")[0] == 200
        gone = presets()["smollm2-135m-instruct"]
        assert gone["declined"] is True and gone["in_catalog"] is False

        status, view = leader.admin("PUT", "/api/v1/presets/auto", {"on": True})
        assert status == 200 and view["auto"] is True
        now = {p["name"]: p for p in view["presets"]}
        assert "declined" in now["smollm2-135m-instruct"]["blocked"], "a declined preset is not added again by itself"
        auto = {name for name, p in now.items() if p.get("added_by") == "auto"}
        assert auto and all(now[name]["in_catalog"] for name in auto), now
        assert auto <= set(listing(leader))
        text = next(name for name in auto if now[name]["makes"] == "text")
        assert any(
            p["blocked"] == f"{text} already makes text"
            for p in now.values()
            if p["makes"] == "text" and not p["in_catalog"] and p["fits"] and not p.get("declined")
        )
        assert now[too_big["name"]]["blocked"].startswith("no node has")

        assert leader.admin("POST", "/api/v1/presets/smollm2-135m-instruct")[0] == 200
        assert presets()["smollm2-135m-instruct"]["declined"] is False, "adding it again clears the decline"
        assert leader.admin("PUT", "/api/v1/presets/auto", {"on": False})[1]["auto"] is False
    finally:
        if worker is not None:
            worker.stop()
        leader.stop()


def test_opod_model_commands_are_clients_of_the_catalog(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "home")
    try:
        added = opod_cli(leader, "model", "add", "sim-chat", "--engine", "sim", "--alias", "chat", "--no-load")
        assert added.returncode == 0, added.stderr
        listed = opod_cli(leader, "model", "ls")
        line = next(line for line in listed.stdout.splitlines() if line.startswith("sim-chat (chat)"))
        assert listed.returncode == 0 and line.split()[2:4] == ["0/0", "standard"], listed.stdout
        rows = json.loads(opod_cli(leader, "model", "ls", "--json").stdout)
        assert rows[0]["name"] == "sim-chat" and rows[0]["min_replicas"] == 0
        shown = json.loads(opod_cli(leader, "model", "show", "chat", "--json").stdout)
        assert shown["profiles"][0]["engine"] == "sim" and shown["scaling"]["min"] == 0
        presets = opod_cli(leader, "catalog", "presets")
        assert presets.returncode == 0 and "smollm2-135m-instruct" in presets.stdout, presets.stderr
        assert opod_cli(leader, "model", "rm", "sim-chat").returncode == 0
        assert http("GET", leader.admin_url + "/api/v1/models", key=leader.key)[2] == []
    finally:
        leader.stop()
