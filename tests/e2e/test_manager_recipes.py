"""The SDK README's recipes 1–10, ported to Python: a manager that speaks only HTTP and the contract types.

Run against a live leader with simulator workers. If a manager written against
the README works here unchanged, opod keeps the contract.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from bench.ports import free_port
from opod.catalog import bundled_dir
from opod.contract import adminapi, nodeapi
from opod.contract import env as contract_env
from opod.contract.blockhash import block_hashes
from opod.contract.catalog import Entry
from opod.contract.nodeauth import HEADER, sign
from tests.support.opod_process import Leader, OpodProcess, clean_env, http, opod_cli, usage_rows, wait_until

MODEL = "sim-chat"


def write_atomically(path: Path, snapshot: nodeapi.WireModel) -> None:
    """Recipe 5's rule: write a temp file and rename it, so the leader never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(snapshot.to_wire(), indent=2))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("recipes")
    files = root / "mounted"
    files.mkdir()
    env = {"OPOD_AUTH_FILE": str(files / "auth.json"), "OPOD_POLICY_FILE": str(files / "policy.json")}
    leader = Leader(root / "leader", worker=False, extra=["--no-default-models"], env=env)
    leader.files = files
    token = leader.node_token()
    workers = []
    for name in ("n_r1", "n_r2"):
        home = root / name
        workers.append(
            OpodProcess(
                ["join", leader.url, "--token", token, "--engine", "sim", "--listen", f"127.0.0.1:{free_port()}"],
                home,
                env=clean_env(home, OPOD_NODE_ID=name),
            )
        )
    for worker in workers:
        worker.wait_for_line("registered with", timeout=30)
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
    leader.wait_served(MODEL)
    leader.token = token
    yield leader
    for worker in workers:
        worker.stop()
    leader.process.stop()


def get(leader: Leader, path: str, kind: type[nodeapi.WireModel], key: str | None = None):
    status, _, body = http("GET", leader.url + path, key=leader.key if key is None else key)
    assert status == 200, f"GET {path}: {status} {body}"
    return kind.from_wire(body)


def chat(leader: Leader, key: str, **extra) -> int:
    return http(
        "POST",
        leader.url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra},
        key=key,
    )[0]


def test_recipe_1_check_which_leader_you_are_talking_to(manager: Leader) -> None:
    version = get(manager, "/admin/v1/version", adminapi.Version)
    assert version.contract == adminapi.CONTRACT_VERSION
    caps = get(manager, "/admin/v1/capabilities", adminapi.Capabilities)
    assert caps.features.get("usage_stream"), "this leader has no usage stream"
    assert any(r.path == "/admin/v1/nodes/{id}/drain" for r in caps.routes)


def test_recipe_2_read_the_load_for_an_autoscaler(manager: Leader) -> None:
    for _ in range(3):
        assert chat(manager, manager.key) == 200
    load = get(manager, "/loadz", adminapi.Load, key="")
    assert load.workers >= 1 and load.rpm_1m >= 3 and load.ts > 0
    assert load.kv_busy_workers >= 0
    if load.engines_unhealthy:
        pytest.fail(f"not capacity: {load.engine_issue}")


def test_recipe_3_pull_every_usage_row_never_lose_one_across_a_restart(manager: Leader) -> None:
    before = get(manager, "/admin/v1/usage/stream?after=0&limit=1000", adminapi.UsageBatch)
    after = before.next
    for _ in range(12):
        assert chat(manager, manager.key) == 200
    seen: dict[int, adminapi.UsageEvent] = {}
    boot = 0
    page = get(manager, f"/admin/v1/usage/stream?after={after}&limit=5", adminapi.UsageBatch)
    boot = page.boot
    for event in page.events or []:
        seen[event.id] = event
    after = page.next
    # The leader restarts between two pages; the cursor goes on where it was.
    assert manager.process.stop() == 0
    restarted = Leader(
        manager.home,
        worker=False,
        extra=["--no-default-models"],
        ports=(manager.port, manager.admin_port),
        env={
            "OPOD_AUTH_FILE": str(manager.files / "auth.json"),
            "OPOD_POLICY_FILE": str(manager.files / "policy.json"),
        },
    )
    manager.process = restarted.process
    wait_until(lambda: MODEL in manager.served(), 30, "the workers to be known again after the restart")
    while True:
        page = get(manager, f"/admin/v1/usage/stream?after={after}&limit=5", adminapi.UsageBatch)
        if page.boot != boot:
            boot = page.boot  # the leader restarted; ids do not restart in opod, so the cursor stays valid
        for event in page.events or []:
            seen[event.id] = event
        after = page.next
        if not page.more:
            break
    ok = [e for e in seen.values() if e.data.outcome == "ok" and e.data.model == MODEL]
    assert len(ok) >= 12
    assert all(e.type == "usage" and e.data.cost_usd == 0 for e in seen.values())
    assert all(not hasattr(e.data, "messages") for e in seen.values()), "content never reaches the stream"


def test_recipe_4_follow_lifecycle_events(manager: Leader) -> None:
    page = get(manager, "/admin/v1/events/stream?after=0&limit=1000", adminapi.EventsBatch)
    types = {e.type for e in page.events or []}
    assert {"node.registered", "model.loaded"} <= types
    assert all(e.subject for e in page.events if e.type.startswith("node."))


def test_recipe_5_write_the_auth_file_a_leader_watches(manager: Leader) -> None:
    plaintext = "sk-opod-alice-" + os.urandom(8).hex()
    snap = adminapi.AuthSnapshot(
        revision="2026-11-29T12:00:00Z#7",
        require_keys=True,
        issued_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        keys=[
            adminapi.SnapshotKey(
                id="alice-laptop",
                name="Alice's laptop",
                hash=hashlib.sha256(plaintext.encode()).hexdigest(),
                expires_at="2099-01-31T00:00:00Z",
                admission_class="standard",
                team="search",
            )
        ],
        revoked_keys=["bob-old"],
    )
    write_atomically(manager.files / "auth.json", snap)
    wait_until(lambda: chat(manager, plaintext) == 200, 2.5, "the new key to work within 2 s")
    # The stream offers committed rows only; the writer commits within moments of the answer.
    wait_until(
        lambda: any(e.data.api_key_id == "k_cp_alice-laptop" for e in usage_rows(manager)),
        2,
        "the key's usage row on the stream, under the manager's id for it",
    )
    revoked = snap.model_copy(update={"revision": "#8", "revoked_keys": ["bob-old", "alice-laptop"]})
    write_atomically(manager.files / "auth.json", revoked)
    started = time.monotonic()
    wait_until(lambda: chat(manager, plaintext) == 401, 2.5, "the revoked key to be refused within 2 s")
    assert time.monotonic() - started < 2.5


def test_recipe_6_write_the_policy_file_a_leader_watches(manager: Leader) -> None:
    pol = adminapi.PolicySnapshot(
        revision="policy-12",
        routing=adminapi.PolicyRouting(kv_weight=2, kv_saturation_pct=90, prefix_affinity=True),
        admission=adminapi.PolicyAdmission(
            hold_ms=2000,
            max_held=200,
            classes=[
                adminapi.PolicyAdmissionClass(name="critical", hold_ms=10000),
                adminapi.PolicyAdmissionClass(name="sheddable", max_share=0.25),
            ],
        ),
    )
    write_atomically(manager.files / "policy.json", pol)

    def event(kind: str) -> list[adminapi.LifecycleEvent]:
        page = get(manager, "/admin/v1/events/stream?after=0&limit=1000", adminapi.EventsBatch)
        return [e for e in page.events or [] if e.type == kind]

    wait_until(lambda: any(e.data.get("revision") == "policy-12" for e in event("policy.updated")), 5, "policy.updated")
    (manager.files / "policy.json").write_text('{"revision": "broken", "routing": {"kvSaturationPct": "lots"}}')
    wait_until(lambda: event("policy.rejected"), 5, "policy.rejected")
    assert "kvSaturationPct" in json.dumps(event("policy.rejected")[-1].data)
    assert chat(manager, manager.key) == 200, "the last good policy keeps serving"


def test_recipe_7_check_the_environment_you_render(manager: Leader) -> None:
    caps = get(manager, "/admin/v1/capabilities", adminapi.Capabilities)
    rendered = {"OPOD_AUTH_FILE": "/etc/opod-auth/auth.json", "OPOD_UI": "0", "OPOD_TYPO": "1", "HF_TOKEN": "x"}
    problems = []
    for name in rendered:
        row = contract_env.lookup(name)
        if row is not None:
            is_version = len(row.since) > 1 and row.since[0] == "v" and row.since[1].isdigit()
            if row.since and not is_version and not caps.features.get(row.since):
                problems.append(f"{name}: this leader lacks feature {row.since}")
            continue
        retired = contract_env.lookup_retired(name)
        if retired is not None:
            problems.append(f"{name}: retired in {retired.retired_in}")
            continue
        if name.startswith("OPOD_"):
            problems.append(f"{name}: not in the contract")
    assert problems == ["OPOD_UI: retired in v0.3.0", "OPOD_TYPO: not in the contract"]


def test_recipe_8_read_the_model_catalog() -> None:
    names = sorted(p.name for p in bundled_dir().glob("*.yaml"))
    entries = [Entry.from_wire(yaml.safe_load((bundled_dir() / name).read_text())) for name in names]
    assert [e.id + ".yaml" for e in entries] == names
    assert any(e.sharding.required for e in entries) and all(e.size_bytes > 0 for e in entries)


def test_recipe_9_speak_the_node_protocol(manager: Leader) -> None:
    hw = nodeapi.encode_hardware(
        nodeapi.Capabilities(
            hostname="gpu-box-1",
            os="linux",
            arch="amd64",
            cpu_cores=32,
            ram_gb=128,
            gpus=[nodeapi.GPU(name="NVIDIA RTX 4090", vram_gb=24)],
            engine="vllm",
        )
    )
    reg = nodeapi.RegisterRequest(
        id="gpu-box-1",
        hostname="gpu-box-1",
        os="linux",
        arch="amd64",
        ram_gb=128,
        address="10.0.0.12:8081",
        hardware_json=hw,
        boot_id=os.urandom(8).hex(),
    )

    def post(path: str, body: nodeapi.WireModel) -> int:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            manager.url + path,
            data=body.to_json().encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                HEADER: sign(reg.id, manager.token, "POST", path, nonce=f"{reg.boot_id}.{time.monotonic_ns()}"),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    assert post(nodeapi.PATH_REGISTER, reg) == 200
    hb = nodeapi.Heartbeat(
        id=reg.id,
        boot_id=reg.boot_id,
        loaded_models=["qwen3-coder-30b"],
        slots=16,
        engine=nodeapi.EngineState(state=nodeapi.EngineStateWord.SERVING),
    )
    assert post(nodeapi.PATH_HEARTBEAT, hb) == 200
    status, _, nodes = http("GET", manager.url + "/admin/v1/nodes", key=manager.key)
    box = next(n for n in nodes if n["id"] == "gpu-box-1")
    assert box["loaded_models"] == ["qwen3-coder-30b"] and box["slots"] == 16
    assert nodeapi.decode_hardware(reg.hardware_json).gpus[0].name == "NVIDIA RTX 4090"


def test_recipe_10_hash_prompt_blocks_the_way_a_worker_does(manager: Leader) -> None:
    tokens = [151644, 872, 198] + list(range(1000, 1061))
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == len(tokens) // 16
    assert hashes[0] == block_hashes(tokens[:16], 16)[0] and hashes[1] != block_hashes(tokens[16:32], 16)[0]
    assert block_hashes([i * 7 for i in range(40)], 16) == ["adc5456162d616d8", "1604d6dafa155320"]
