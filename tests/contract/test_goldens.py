"""Every golden body of the node protocol decodes into its type and encodes back to the same bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from opod.contract import gojson
from opod.contract import nodeapi as n
from opod.contract.wire import SECOND, WireError, WireModel, decode_list, encode_list

CAPS_FULL = n.Capabilities(
    hostname="node-a",
    os="linux",
    arch="amd64",
    cpu_cores=32,
    ram_gb=128,
    gpus=[n.GPU(name="NVIDIA A100-SXM4-80GB", vram_gb=79)] * 2,
    role=n.ROLE_DECODE,
    plan_revision=7,
    engine="vllm",
)
HW_GOLDEN = (
    '{"Hostname":"node-a","OS":"linux","Arch":"amd64","CPUCores":32,"RAMGB":128,'
    '"GPUs":[{"Name":"NVIDIA A100-SXM4-80GB","VRAMGB":79},{"Name":"NVIDIA A100-SXM4-80GB","VRAMGB":79}],'
    '"Role":"decode","PlanRevision":7,"Engine":"vllm"}'
)
LOAD_SRC = dict(
    id="llama-3.2-3b-gguf",
    ollama_name="llama3.2:3b",
    repo="example/Llama-3.2-3B-Instruct-GGUF",
    path="/data/models/llama-3.2-3b.gguf",
)
STARTED = datetime(2026, 9, 18, 12, 0, tzinfo=UTC)
ADAPTER_SRC = "example/qwen3-8b-support-lora"

# golden name -> (type, or [type] for a top-level array; the populated value the binary wrote)
CASES: dict[str, tuple[Any, Any]] = {
    "register_request": (
        n.RegisterRequest,
        n.RegisterRequest(
            id="n_worker-0",
            hostname="node-a",
            os="linux",
            arch="amd64",
            ram_gb=128,
            address="192.0.2.10:8081",
            hardware_json=n.encode_hardware(CAPS_FULL),
            boot_id="0123456789abcdef",
        ),
    ),
    "register_response": (n.RegisterResponse, n.RegisterResponse(status=n.Status.REGISTERED, id="n_worker-0")),
    "capabilities": (n.Capabilities, CAPS_FULL),
    "capabilities_minimal": (
        n.Capabilities,
        n.Capabilities(hostname="node-b", os="linux", arch="amd64", cpu_cores=8, ram_gb=16),
    ),
    "heartbeat": (
        n.Heartbeat,
        n.Heartbeat(
            id="n_worker-0",
            loaded_models=["qwen2.5-0.5b-gguf", "qwen2.5-0.5b-gguf:support"],
            boot_id="0123456789abcdef",
            resident_models=["qwen2.5-0.5b-gguf"],
            sleeping=True,
            load=n.EngineLoad(
                kv_used_pct=62.5, queue_depth=3, tokens_per_s=148.25, prefix_hit_pct=41, sampled_at=1789732800
            ),
        ),
    ),
    "heartbeat_kv_blocks": (
        n.Heartbeat,
        n.Heartbeat(
            id="n_worker-0",
            loaded_models=["m"],
            boot_id="0123456789abcdef",
            kv_blocks=n.KVBlocks(seq=7, block_size=16, stored=["0f1e2d3c4b5a6978"], removed=["8796a5b4c3d2e1f0"]),
        ),
    ),
    "heartbeat_minimal": (n.Heartbeat, n.Heartbeat(id="n_worker-0", boot_id="0123456789abcdef")),
    "heartbeat_response": (n.HeartbeatResponse, n.HeartbeatResponse(status=n.Status.OK)),
    "tokenize_request": (
        n.TokenizeRequest,
        n.TokenizeRequest(
            model="m",
            messages=[n.TokenizeMessage(role="system", content="s"), n.TokenizeMessage(role="user", content="u")],
            max_tokens=1024,
        ),
    ),
    "tokenize_response": (n.TokenizeResponse, n.TokenizeResponse(tokens=[1, 2, 3])),
    "load_model_request": (
        n.LoadModelRequest,
        n.LoadModelRequest(**LOAD_SRC, file="Llama-3.2-3B-Instruct-Q4_K_M.gguf", pin=True),
    ),
    "load_model_request_leader": (n.LoadModelRequest, n.LoadModelRequest(**LOAD_SRC, pin=True)),
    "load_model_response": (n.LoadModelResponse, n.LoadModelResponse(status=n.Status.READY, model="llama-3.2-3b.gguf")),
    "unload_model_request": (n.UnloadModelRequest, n.UnloadModelRequest(**LOAD_SRC)),
    "unload_model_response": (
        n.UnloadModelResponse,
        n.UnloadModelResponse(status=n.Status.UNLOADED, model="llama-3.2-3b.gguf"),
    ),
    "unload_model_response_noop": (
        n.UnloadModelResponse,
        n.UnloadModelResponse(
            status=n.Status.NOOP, model="llama-3.2-3b.gguf", reason="not resident in this worker's engine"
        ),
    ),
    "unload_model_response_unsupported": (
        n.UnloadModelResponse,
        n.UnloadModelResponse(
            status=n.Status.UNSUPPORTED,
            engine="vllm",
            reason="the engine cannot unload a model and this worker did not start it; stop the engine, or the worker, instead",
        ),
    ),
    "sleep_response": (n.SleepResponse, n.SleepResponse(status=n.Status.SLEEPING, engine="vllm")),
    "sleep_response_unsupported": (
        n.SleepResponse,
        n.SleepResponse(
            status=n.Status.UNSUPPORTED, engine="llamacpp", reason="engine has no sleep mode; park the pod instead"
        ),
    ),
    "load_adapter_request": (
        n.LoadAdapterRequest,
        n.LoadAdapterRequest(base="qwen3-8b", name="support", source=ADAPTER_SRC, rank=64),
    ),
    "load_adapter_request_minimal": (
        n.LoadAdapterRequest,
        n.LoadAdapterRequest(base="qwen3-8b", name="support", source=ADAPTER_SRC),
    ),
    "unload_adapter_request": (n.UnloadAdapterRequest, n.UnloadAdapterRequest(base="qwen3-8b", name="support")),
    "adapter_response": (n.AdapterResponse, n.AdapterResponse(status=n.Status.READY, model="qwen3-8b:support")),
    "held_adapters": ([n.HeldAdapter], [n.HeldAdapter(id="qwen3-8b:support", name="support", source=ADAPTER_SRC)]),
    "adapters_env": (
        [n.Adapter],
        [
            n.Adapter(name="support", source=ADAPTER_SRC, rank=64),
            n.Adapter(name="legal", source="/data/adapters/legal"),
        ],
    ),
    "process_spec": (
        n.ProcessSpec,
        n.ProcessSpec(
            id="s-qwen-0",
            command="rpc-server",
            args=["-p", "50052"],
            env={"CUDA_VISIBLE_DEVICES": "0"},
            work_dir="/data",
            health_port=50052,
            health_host="0.0.0.0",
            log_lines=400,
            health_path="/health",
            ready_timeout=15 * 60 * SECOND,
            restart=True,
            max_restarts=5,
            restart_backoff=SECOND,
        ),
    ),
    "process_spec_minimal": (n.ProcessSpec, n.ProcessSpec(id="s-qwen-0", command="rpc-server")),
    "process_info": (
        n.ProcessInfo,
        n.ProcessInfo(
            id="s-qwen-0",
            command="rpc-server",
            args=["-p", "50052"],
            pid=4242,
            started_at=STARTED,
            status=n.ProcessStatus.FAILED,
            exit_err="exit status 1",
            address="192.0.2.10:50052",
            restarts=2,
        ),
    ),
    "process_info_minimal": (
        n.ProcessInfo,
        n.ProcessInfo(
            id="s-qwen-0",
            command="rpc-server",
            args=["-p", "50052"],
            pid=4242,
            started_at=STARTED,
            status=n.ProcessStatus.STARTING,
        ),
    ),
    "stop_process_request": (n.StopProcessRequest, n.StopProcessRequest(id="s-qwen-0")),
    "start_process_error": (n.StartProcessError, n.StartProcessError(error="ProcessSpec.ID required")),
    "upload_response": (
        n.UploadResponse,
        n.UploadResponse(
            path="/data/models/llama-3.2-3b.gguf",
            sha256="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            size=2019377696,
        ),
    ),
}


def _encode(kind: Any, value: Any) -> str:
    if isinstance(kind, list):
        return gojson.canonical(encode_list(value))
    return value.to_canonical()


def _decode(kind: Any, text: str) -> Any:
    if isinstance(kind, list):
        return decode_list(kind[0], text)
    return kind.from_wire(text)


def _golden(testdata: Path, name: str) -> str:
    return (testdata / f"{name}.json").read_text(encoding="utf-8")


def test_every_golden_has_a_case_and_every_case_a_golden(testdata: Path) -> None:
    on_disk = {p.stem for p in testdata.glob("*.json")}
    assert on_disk == set(CASES), (
        f"goldens without a case: {on_disk - set(CASES)}; cases without a golden: {set(CASES) - on_disk}"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_typed_value_marshals_to_the_golden(testdata: Path, name: str) -> None:
    kind, value = CASES[name]
    assert _encode(kind, value) == _golden(testdata, name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_golden_round_trips_byte_for_byte(testdata: Path, name: str) -> None:
    kind, value = CASES[name]
    text = _golden(testdata, name)
    decoded = _decode(kind, text)
    assert decoded == value
    assert _encode(kind, decoded) == text


def _add_unknown_keys(node: Any, inside_env: bool = False) -> Any:
    if isinstance(node, dict):
        out = {k: _add_unknown_keys(v, inside_env=(k == "Env")) for k, v in node.items()}
        if not inside_env:
            out["x_from_a_newer_version"] = {"n": 1}
        return out
    if isinstance(node, list):
        return [_add_unknown_keys(v) for v in node]
    return node


@pytest.mark.parametrize("name", sorted(CASES))
def test_unknown_keys_at_every_depth_are_ignored(testdata: Path, name: str) -> None:
    kind, value = CASES[name]
    noisy = json.dumps(_add_unknown_keys(json.loads(_golden(testdata, name))))
    assert "x_from_a_newer_version" in noisy
    assert _decode(kind, noisy) == value


def test_hardware_json_is_byte_exact() -> None:
    assert n.encode_hardware(CAPS_FULL) == HW_GOLDEN
    assert n.decode_hardware(HW_GOLDEN) == CAPS_FULL
    assert CASES["register_request"][1].hardware() == CAPS_FULL


def test_opods_disk_keys_follow_the_contracts_and_are_absent_when_unknown() -> None:
    with_disk = CAPS_FULL.model_copy(update={"disk_free_gb": 120, "disk_total_gb": 500})
    assert n.encode_hardware(with_disk) == HW_GOLDEN[:-1] + ',"DiskFreeGB":120,"DiskTotalGB":500}'
    assert n.decode_hardware(n.encode_hardware(with_disk)) == with_disk
    assert "Disk" not in n.encode_hardware(CAPS_FULL)  # zero: not reported, and the golden bytes stand


def test_hardware_json_uses_go_escaping() -> None:
    caps = n.Capabilities(hostname="a<b>&c\u2028é")
    assert n.encode_hardware(caps).startswith('{"Hostname":"a\\u003cb\\u003e\\u0026c\\u2028é"')


def test_empty_hardware_is_the_zero_value_and_malformed_is_an_error() -> None:
    assert n.decode_hardware("") == n.Capabilities()
    with pytest.raises(WireError, match="not valid JSON"):
        n.decode_hardware("{not json")


# Which keys a zero value writes (CONTRACT.md §4.8 rule 7).
PRESENCE = [
    (n.Heartbeat(), "loaded_models", True),
    (n.Heartbeat(), "boot_id", True),
    (n.Heartbeat(), "sleeping", False),
    (n.Heartbeat(), "load", False),
    (n.Heartbeat(), "resident_models", False),
    (n.Heartbeat(resident_models=[]), "resident_models", True),
    (n.Capabilities(), "Engine", False),
    (n.RegisterRequest(), "boot_id", True),
    (n.RegisterRequest(), "hardware_json", True),
    (n.Capabilities(), "GPUs", True),
    (n.Capabilities(), "Role", False),
    (n.Capabilities(), "PlanRevision", False),
    (n.LoadModelRequest(), "file", False),
    (n.LoadModelRequest(), "ollama_name", True),
    (n.LoadModelRequest(), "pin", True),
    (n.UnloadModelRequest(), "ollama_name", True),
    (n.UnloadModelRequest(), "repo", True),
    (n.UnloadModelRequest(), "path", True),
    (n.UnloadModelResponse(), "status", True),
    (n.UnloadModelResponse(), "model", False),
    (n.UnloadModelResponse(), "engine", False),
    (n.UnloadModelResponse(), "reason", False),
    (n.SleepResponse(), "reason", False),
    (n.Adapter(), "rank", False),
    (n.LoadAdapterRequest(), "rank", False),
    (n.LoadAdapterRequest(), "source", True),
    (n.ProcessSpec(), "ReadyTimeout", True),
    (n.ProcessSpec(), "Env", True),
    (n.ProcessInfo(), "exit_err", False),
    (n.ProcessInfo(), "address", False),
    (n.ProcessInfo(), "restarts", False),
    (n.StartProcessError(), "info", True),
]


@pytest.mark.parametrize(("value", "key", "present"), PRESENCE, ids=lambda x: x if isinstance(x, str) else None)
def test_omitted_versus_zero(value: WireModel, key: str, present: bool) -> None:
    assert (key in value.to_wire()) is present


def test_null_and_empty_loaded_models_stay_different_words() -> None:
    assert '"loaded_models":null' in n.Heartbeat(id="a").to_json()
    assert '"loaded_models":[]' in n.Heartbeat(id="a", loaded_models=[]).to_json()
    assert n.Heartbeat.from_wire('{"loaded_models":null}').loaded_models is None
    assert n.Heartbeat.from_wire('{"loaded_models":[]}').loaded_models == []


def test_load_response_and_durations_have_the_literal_text_scripts_grep_for() -> None:
    assert '"status":"ready"' in n.LoadModelResponse(status="ready", model="m").to_json()
    spec = n.ProcessSpec(ready_timeout=15 * 60 * SECOND, restart_backoff=SECOND).to_json()
    assert '"ReadyTimeout":900000000000' in spec
    assert '"RestartBackoff":1000000000' in spec


def test_engine_state_is_optional_and_additive() -> None:
    hb = n.Heartbeat.from_wire('{"id":"n_w0","loaded_models":["m"],"boot_id":"b"}')
    assert hb.engine is None
    assert "engine" not in hb.to_json()
    looping = n.Heartbeat(
        id="n_w0",
        loaded_models=["m"],
        boot_id="b",
        engine=n.EngineState(
            state="crash-looping", restarts=4, since="2026-09-20T09:00:00Z", detail="exit status 1: CUDA error"
        ),
    )
    again = n.Heartbeat.from_wire(looping.to_json())
    assert again == looping
    assert again.engine.word is n.EngineStateWord.CRASH_LOOPING
    assert n.EngineState(state="hibernating").word is None


def test_keys_match_case_insensitively_when_no_exact_key_exists() -> None:
    caps = n.Capabilities.from_wire('{"hostname":"h","cpucores":4,"gpus":[{"name":"g","vramgb":8}]}')
    assert caps.hostname == "h" and caps.cpu_cores == 4
    assert caps.gpus == [n.GPU(name="g", vram_gb=8)]


def test_null_for_a_plain_field_leaves_the_zero_value() -> None:
    hb = n.Heartbeat.from_wire('{"id":null,"sleeping":null,"boot_id":"b"}')
    assert hb.id == "" and hb.sleeping is False and hb.boot_id == "b"


@pytest.mark.parametrize(
    ("kind", "body", "names"),
    [
        (n.Heartbeat, '{"loaded_models":"m"}', "loaded_models: expected an array, got a string"),
        (n.Heartbeat, '{"load":{"kv_used_pct":"high"}}', "load.kv_used_pct: expected a number, got a string"),
        (n.RegisterRequest, '{"ram_gb":12.5}', "ram_gb: expected an integer, got a number"),
        (n.Heartbeat, '{"sleeping":"yes"}', "sleeping: expected true or false, got a string"),
        (n.ProcessInfo, '{"started_at":"yesterday"}', "started_at: 'yesterday' is not an RFC 3339 time"),
        (n.Heartbeat, "[1,2]", "expected a JSON object, got an array"),
        (n.Heartbeat, '{"id": ', "not valid JSON"),
    ],
)
def test_a_wrong_type_is_a_clear_error_naming_the_field(kind: type[WireModel], body: str, names: str) -> None:
    with pytest.raises(WireError) as caught:
        kind.from_wire(body)
    assert names in str(caught.value)
    assert str(caught.value).startswith(kind.__name__)
