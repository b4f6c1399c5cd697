"""Registry plans and serve jobs: ``GET /plan``, ``POST /models/serve``, ``GET /jobs``, end to end.

A leader in the test's process with one ``opod join`` worker running llama.cpp on this CPU, and a
loopback Hub (``tests/support/hubserver.py``) holding real files: a tiny llama GGUF that opod makes,
in several quantisations; the original safetensors of a model with its ``config.json``; a gated
repository; and the header of a large model, which plans read without its weights.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.ports import free_port
from opod.control.serve_steps import EVAL_SKIPPED
from opod.leader.batches import runner_owner
from opod.store import Store
from opod.store.serve_jobs import new_serve_job_id
from tests.support.hubserver import HubServer
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, clean_env, opod_cli, wait_until

TINY = "acme/tiny-GGUF"
QUANTS = ("Q4_K_M", "Q8_0", "Q2_K")
ORIGINAL = "acme/tiny-base"
GATED = "acme/gated-GGUF"
BIG = "acme/huge-GGUF"
CONFIG = (
    b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,'
    b' "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}'
)


def readme(licence: str) -> bytes:
    return f"---\nlicense: {licence}\ntags: [test]\n---\n# A model for tests\n".encode()


def gguf_header(keys: dict[str, int]) -> bytes:
    """A GGUF's start: a llama's keys (u32 values), no tensors; a plan reads no further."""

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    pairs = [text("general.architecture") + struct.pack("<I", 8) + text("llama")]
    pairs += [text(f"llama.{key}") + struct.pack("<II", 4, value) for key, value in keys.items()]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + b"".join(pairs)


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer().running_in_thread() as server:
        for seed, quant in enumerate(QUANTS):
            server.add_tiny_gguf(TINY, f"tiny-{quant}.gguf", seed=seed)
        server.add_file(TINY, "README.md", readme("apache-2.0"))
        server.add_file(ORIGINAL, "config.json", CONFIG)
        server.add_file(ORIGINAL, "model.safetensors", bytes(64 * 1024))
        server.add_file(ORIGINAL, "README.md", readme("mit"))
        server.add_tiny_gguf(GATED, "gated-Q4_K_M.gguf")
        server.require_token(GATED, "hf_granted")
        # 80 layers of 8 KV heads of 128: 320 kB of KV cache a token, more than any machine holds at 10M tokens.
        header = gguf_header(
            {"block_count": 80, "embedding_length": 8192, "attention.head_count": 64, "attention.head_count_kv": 8}
        )
        server.add_file(BIG, "huge-Q4_K_M.gguf", header + bytes(300_000), lfs=True)
        yield server


@pytest.fixture(scope="module")
def fleet(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    root = tmp_path_factory.mktemp("serve")
    leader = Leader(root / "leader", env={"HF_ENDPOINT": hub.url})
    home = root / "cpu-1"
    argv = ["join", leader.url, "--token", leader.node_token(), "--listen", f"127.0.0.1:{free_port()}"]
    worker = OpodProcess(argv, home, env=clean_env(home, OPOD_NODE_ID="cpu-1", HF_ENDPOINT=hub.url))
    try:
        wait_until(lambda: leader.admin("GET", "/api/v1/nodes")[1], 60, "the worker to join")
        yield leader
    finally:
        worker.stop()
        leader.stop()


def get(leader: Leader, path: str) -> Any:
    status, body = leader.admin("GET", path)
    assert status == 200, body
    return body


def refused(leader: Leader, body: dict[str, Any], status: int) -> str:
    got, answer = leader.admin("POST", "/api/v1/models/serve", body)
    assert got == status and isinstance(answer, dict) and set(answer) == {"error"}, (got, answer)
    return str(answer["error"])


def test_a_gguf_plan_lists_each_quantisation_with_where_it_runs_best_first(fleet: Leader, hub: HubServer) -> None:
    plan = get(fleet, f"/api/v1/plan?repo={TINY}")
    assert plan["servable"] is True and "reason" not in plan
    assert plan["revision"] == hub.commit(TINY) and plan["format"] == "gguf" and plan["context"] == 4096
    assert plan["license"] == "apache-2.0" and plan["architecture"] == "llama" and plan["gated"] is False
    assert plan["params"] > 0 and "estimated" in plan["note"]
    assert {a["quant"]: a["name"] for a in plan["artifacts"]} == {q: f"tiny-{q}.gguf" for q in QUANTS}
    for artifact in plan["artifacts"]:
        assert artifact["bytes"] > 500_000 and artifact["shards"] == 1
        assert artifact["best"]["engine"] == "llamacpp" and artifact["best"]["cpu"] is True
    first = plan["options"][0]
    assert first["artifact"] == "tiny-Q4_K_M.gguf", "Q4_K_M is offered first"
    assert first["hosts"] == 1 and first["free_now"] is True and first["bits_per_weight"] == 4.89
    assert 0 < first["need_gb"] < first["have_gb"]
    # A longer context needs more memory for the same file.
    longer = get(fleet, f"/api/v1/plan?repo={TINY}&context=1000000")
    assert longer["context"] == 1_000_000 and longer["options"][0]["need_gb"] > first["need_gb"]


def test_safetensors_on_a_cpu_only_fleet_are_planned_but_not_servable(fleet: Leader) -> None:
    plan = get(fleet, f"/api/v1/plan?repo={ORIGINAL}&format=safetensors")
    assert plan["servable"] is False and "no node of this fleet has a GPU" in plan["reason"], plan
    assert plan["architecture"] == "LlamaForCausalLM" and plan["license"] == "mit"
    assert plan["artifacts"] == [
        {"name": "original", "format": "safetensors", "bytes": 64 * 1024, "shards": 1, "quant": "bf16"}
    ]
    assert "options" not in plan
    as_gguf = get(fleet, f"/api/v1/plan?repo={ORIGINAL}")
    assert as_gguf["servable"] is False and "has no gguf files (it has safetensors" in as_gguf["reason"]


def test_a_gated_repository_is_said_gated_and_an_unknown_one_is_refused(fleet: Leader) -> None:
    plan = get(fleet, f"/api/v1/plan?repo={GATED}")
    assert plan["gated"] is True and plan["servable"] is False and "HF_TOKEN" in plan["reason"], plan
    status, body = fleet.admin("GET", "/api/v1/plan?repo=acme/no-such-repo")
    assert status == 404 and "repo:" in body["error"] and "acme/no-such-repo" in body["error"], body
    status, body = fleet.admin("GET", f"/api/v1/plan?repo={TINY}&format=onnx")
    assert status == 400 and body["error"].startswith("format:"), body


@pytest.fixture(scope="module")
def taken(fleet: Leader) -> str:
    status, body = fleet.admin("POST", "/api/v1/models", {"name": "taken", "profiles": [{"engine": "sim"}]})
    assert status == 200, body
    return "taken"


def test_bad_requests_are_refused_before_any_job_starts(fleet: Leader, taken: str) -> None:
    before = get(fleet, "/api/v1/jobs")
    assert "repo: required" in refused(fleet, {}, 400)
    assert "acme/nothing-here" in refused(fleet, {"repo": "acme/nothing-here"}, 404)
    assert "gated" in refused(fleet, {"repo": GATED}, 403)
    assert "no node of this fleet has a GPU" in refused(fleet, {"repo": ORIGINAL, "format": "safetensors"}, 400)
    assert "quant: acme/tiny-GGUF has no Q6_K file; it has Q2_K, Q4_K_M, Q8_0" in refused(
        fleet, {"repo": TINY, "quant": "Q6_K"}, 400
    )
    error = refused(fleet, {"repo": BIG, "context_length": 10_000_000}, 400)
    assert error.startswith("context:") and "10000000 tokens" in error and "GB" in error, error
    assert f"name: {taken!r} is already a name of model" in refused(fleet, {"repo": TINY, "name": taken}, 409)
    assert get(fleet, "/api/v1/jobs") == before


@pytest.mark.engine
def test_serving_fetches_places_starts_and_tries_the_model(fleet: Leader, hub: HubServer) -> None:
    from tests.support.llama_server import command

    command()  # skips, saying why, where no llama-server runs on this CPU
    hub.cut_after("tiny-Q4_K_M.gguf", 300_000)  # the fetch resumes where the cut left it
    hub.requests.clear()
    status, job = fleet.admin(
        "POST",
        "/api/v1/models/serve",
        {"repo": TINY, "name": "tiny", "aliases": ["tiny-chat"]},
        {"X-Llmgw-Actor": "ops"},
    )
    assert status == 202 and job["state"] == "running" and job["model"] == "tiny", job
    assert [s["name"] for s in job["steps"]] == ["resolve", "fetch", "place", "start", "smoke test", "eval"]
    assert job["steps"][0]["state"] == "done" and "tiny-Q4_K_M.gguf" in job["steps"][0]["detail"]
    assert job["request"] == {"repo": TINY, "name": "tiny", "aliases": ["tiny-chat"]}
    seen: list[dict[str, Any]] = []

    def ended() -> bool:
        seen.append(get(fleet, f"/api/v1/jobs/{job['id']}"))
        return seen[-1]["state"] != "running"

    wait_until(ended, 120, "the serve job to end", interval=0.05)
    done = seen[-1]
    assert done["state"] == "succeeded", done
    steps = {s["name"]: s for s in done["steps"]}
    assert steps["fetch"]["state"] == "done" and "100% of 771 kB" in steps["fetch"]["detail"]
    assert steps["place"]["state"] == "done" and "cpu-1" in steps["place"]["detail"]
    assert steps["start"]["state"] == "done" and steps["start"]["detail"].startswith("serving on cpu-1")
    assert steps["eval"] == {**steps["eval"], "state": "skipped", "detail": EVAL_SKIPPED}
    assert done["reply"].strip() and done["tokens_per_second"] > 0
    assert any(s["state"] == "running" for j in seen for s in j["steps"] if s["name"] in ("start", "place"))
    # The plan read the header alone; the leader's fetch resumed after the cut; then the worker fetched its own copy
    # (its home is another, as another machine's would be).
    assert [r.range for r in hub.requests if r.origin == "cdn"] == ["bytes=0-262143", None, "bytes=300000-", None]

    model = get(fleet, "/api/v1/models/tiny")
    assert model["origin"]["repo"] == TINY and model["origin"]["revision"] == hub.commit(TINY)
    assert model["origin"]["files"][0]["path"] == "tiny-Q4_K_M.gguf" and model["source"] == f"{TINY}/tiny-Q4_K_M.gguf"
    assert "tiny" in fleet.served() and any(j["id"] == job["id"] for j in get(fleet, "/api/v1/jobs"))
    audit = get(fleet, "/api/v1/audit?actor=ops")
    assert [a["target"] for a in audit if a["action"] == "POST /api/v1/models/serve"] == [
        "model:tiny",
        f"job:{job['id']}",
    ]
    assert "name: 'tiny' is already a name of model 'tiny'" in refused(fleet, {"repo": TINY, "name": "tiny"}, 409)


@pytest.mark.engine
def test_the_opod_command_plans_serves_with_progress_and_lists_jobs(fleet: Leader) -> None:
    from tests.support.llama_server import command

    command()
    planned = opod_cli(fleet, "ctl", "plan", TINY)
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    assert "llama" in lines[0] and "licence apache-2.0" in lines[0] and "at 4096 tokens" in lines[0]
    assert lines[2].split()[:4] == ["tiny-Q4_K_M.gguf", "Q4_K_M", "752.5", "KiB"], planned.stdout
    served = opod_cli(fleet, "ctl", "serve", TINY, "--quant", "Q8_0", "--name", "tiny-q8", "--replicas", "0")
    assert served.returncode == 0, served.stdout + served.stderr
    assert "tiny-q8 serves; its smoke test answered at" in served.stdout, served.stdout
    assert "on demand: the smoke test's request places and starts it" in served.stdout
    listed = opod_cli(fleet, "ctl", "serve-jobs", "ls")
    assert listed.returncode == 0 and "tiny-q8" in listed.stdout and "succeeded" in listed.stdout, listed.stdout
    job_id = next(line.split()[0] for line in listed.stdout.splitlines() if "tiny-q8" in line)
    shown = opod_cli(fleet, "ctl", "serve-jobs", "show", job_id)
    assert shown.returncode == 0 and "smoke test" in shown.stdout and "no suite asked" in shown.stdout


def test_no_job_is_left_running_after_the_leader_stops_under_it(hub: HubServer, tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader", env={"HF_ENDPOINT": hub.url})
    home = tmp_path / "cpu-2"
    argv = ["join", leader.url, "--token", leader.node_token(), "--listen", f"127.0.0.1:{free_port()}"]
    worker = OpodProcess(argv, home, env=clean_env(home, OPOD_NODE_ID="cpu-2", HF_ENDPOINT=hub.url))
    try:
        wait_until(lambda: leader.admin("GET", "/api/v1/nodes")[1], 60, "the worker to join")
        status, job = leader.admin("POST", "/api/v1/models/serve", {"repo": TINY, "name": "cut", "quant": "Q2_K"})
        assert status == 202, job
        leader.stop()  # while the job fetches, places or starts
        # And a job a leader could not end, as a crash leaves it: still running in the store.
        with Store.open(f"sqlite:///{leader.home / 'opod.db'}") as store:
            crashed = new_serve_job_id()
            store.add_serve_job(
                crashed,
                json.dumps(
                    {
                        "id": crashed,
                        "state": "running",
                        "steps": [{"name": "fetch", "state": "running"}, {"name": "place", "state": "waiting"}],
                    }
                ),
                runner=runner_owner(leader.home),
            )
        leader = Leader(leader.home, env=leader.env, ports=(leader.port, leader.admin_port))
        for job_id in (job["id"], crashed):
            after = get(leader, f"/api/v1/jobs/{job_id}")
            assert after["state"] == "failed" and "the leader stopped while this job ran" in after["error"], after
            assert not [s for s in after["steps"] if s["state"] in ("running", "waiting")], after
        assert all(j["state"] != "running" for j in get(leader, "/api/v1/jobs"))
    finally:
        worker.stop()
        leader.stop()
