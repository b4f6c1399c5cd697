"""Each driver's own command line and abilities, against scripted engine endpoints."""

from __future__ import annotations

import json
import sys

import aiohttp
import pytest
from aiohttp import web

from opod.contract import nodeapi
from opod.engines.base import LaunchSpec
from opod.engines.errors import EngineCallError, LaunchError
from opod.engines.registry import get_driver
from tests.engines.conftest import fake_engine, status


def spec(**kw: object) -> LaunchSpec:
    return LaunchSpec(**{"model_id": "m1", "model": "/w/m1", "port": 9000, **kw})  # type: ignore[arg-type]


def test_llamacpp_argv() -> None:
    argv = get_driver("llamacpp").argv(
        spec(
            model="/w/m.gguf",
            context=4096,
            parallel=2,
            threads=2,
            binary="/opt/llama-server",
            flags={"ngl": "all", "ctk": "q8_0", "rpc": ["10.0.0.2:50052", "10.0.0.3:50052"]},
        )
    )
    assert argv == [
        "/opt/llama-server",
        "-m",
        "/w/m.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--alias",
        "m1",
        "--metrics",
        "-c",
        "8192",
        "-np",
        "2",
        "-t",
        "2",
        "-ngl",
        "all",
        "-ctk",
        "q8_0",
        "--jinja",
        "--rpc",
        "10.0.0.2:50052,10.0.0.3:50052",
    ]
    emb = get_driver("llamacpp").argv(spec(binary="ls", embeddings=True, flags={"pooling": "mean", "np": 4}))
    assert emb[-5:] == ["-np", "4", "--embeddings", "--pooling", "mean"]
    assert get_driver("llamacpp").argv(spec(binary="ls", rerank=True))[-1] == "--reranking"
    assert "--jinja" not in emb


def test_llamacpp_gives_each_slot_the_context_a_request_is_promised() -> None:
    """llama-server splits --ctx-size across its slots: each of 4 slots holds 8192 tokens only with -c 32768."""
    driver = get_driver("llamacpp")
    argv = driver.argv(spec(binary="ls", context=8192, parallel=4))
    assert argv[argv.index("-c") + 1] == "32768" and argv[argv.index("-np") + 1] == "4"
    pinned = driver.argv(spec(binary="ls", context=8192, parallel=4, flags={"ctx": 2048, "np": 3}))
    assert pinned[pinned.index("-c") + 1] == "6144" and pinned[pinned.index("-np") + 1] == "3"
    default_slots = driver.argv(spec(binary="ls", context=4096))
    assert default_slots[default_slots.index("-c") + 1] == "4096" and "-np" not in default_slots
    with pytest.raises(LaunchError, match="flags.ctk: 'q9' is not one of"):
        get_driver("llamacpp").argv(spec(binary="ls", flags={"ctk": "q9"}))
    with pytest.raises(LaunchError, match="holds a comma"):
        get_driver("llamacpp").argv(spec(binary="ls", model_id="a,b"))


def test_vllm_argv_and_env() -> None:
    driver = get_driver("vllm")
    s = spec(
        model="Qwen/Qwen3-8B",
        context=8192,
        flags={"tp": 2, "gpu_memory_utilization": 0.85, "max_num_seqs": 128, "trust_remote_code": True},
        kv_events_endpoint="tcp://127.0.0.1:5557",
    )
    argv = driver.argv(s)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[3:16] == [
        "--model",
        "Qwen/Qwen3-8B",
        "--served-model-name",
        "m1",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--max-num-seqs",
        "128",
        "--max-model-len",
        "8192",
        "--tensor-parallel-size",
    ]
    assert "--gpu-memory-utilization" in argv and "0.85" in argv and "--trust-remote-code" in argv
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557",
        "topic": "kv-events",
    }
    assert "--enable-sleep-mode" not in argv and "VLLM_SERVER_DEV_MODE" not in driver.env(s)
    asleep = spec(sleep_mode=True)
    assert "--enable-sleep-mode" in driver.argv(asleep) and driver.env(asleep)["VLLM_SERVER_DEV_MODE"] == "1"
    assert driver.argv(spec())[driver.argv(spec()).index("--max-num-seqs") + 1] == "256"
    assert driver.argv(spec(embeddings=True))[-4:] == ["--runner", "pooling", "--convert", "embed"]
    assert driver.argv(spec(rerank=True))[-4:] == ["--runner", "pooling", "--convert", "classify"]
    assert driver.argv(spec(binary="/envs/vllm/bin/python"))[0] == "/envs/vllm/bin/python"
    with pytest.raises(LaunchError, match=r"flags.gpu_memory_utilization: 1.5 is not a number in \(0, 1\]"):
        driver.argv(spec(flags={"gpu_memory_utilization": 1.5}))


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_runtime_lora_is_turned_on_by_the_rank_flag(engine: str) -> None:
    driver = get_driver(engine)
    plain = spec()
    assert "--enable-lora" not in driver.argv(plain) and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in driver.env(plain)
    assert driver.lora_rank(plain) == 0
    lora = spec(flags={"max_lora_rank": 32, "max_loras": 4})
    argv = driver.argv(lora)
    assert argv[argv.index("--enable-lora") :][:5] == ["--enable-lora", "--max-lora-rank", "32", "--max-loras", "4"]
    assert driver.lora_rank(lora) == 32
    if engine == "vllm":
        assert driver.env(lora)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    with pytest.raises(
        LaunchError, match="flags.max_lora_rank: 24 is not a rank vLLM can be started for; use one of 1, 8, 16"
    ):
        driver.argv(spec(flags={"max_lora_rank": 24}))
    assert get_driver("llamacpp").lora_ranks == () and get_driver("sglang").lora_ranks == ()


def test_sglang_argv() -> None:
    argv = get_driver("sglang").argv(
        spec(model="Qwen/Qwen3-8B", context=8192, parallel=16, flags={"tp": 4, "dp": 2, "mem_fraction_static": 0.8})
    )
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert argv[3:] == [
        "--model-path",
        "Qwen/Qwen3-8B",
        "--served-model-name",
        "m1",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--enable-metrics",
        "--context-length",
        "8192",
        "--max-running-requests",
        "16",
        "--tp-size",
        "4",
        "--dp-size",
        "2",
        "--mem-fraction-static",
        "0.8",
    ]
    assert get_driver("sgl").argv(spec(embeddings=True))[-1] == "--is-embedding"


def test_sim_argv_speaks_vllm_by_default() -> None:
    argv = get_driver("sim").argv(
        spec(
            model="anything", parallel=8, flags={"seed": 3, "time_scale": 0}, kv_events_endpoint="tcp://127.0.0.1:6000"
        )
    )
    assert argv == [
        sys.executable,
        "-m",
        "opod",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--model",
        "m1",
        "--dialect",
        "vllm",
        "--max-batch",
        "8",
        "--seed",
        "3",
        "--time-scale",
        "0",
        "--kv-events",
        "tcp://127.0.0.1:6000",
    ]
    assert "--dialect" in get_driver("sim").argv(spec(flags={"dialect": "vllm"}))
    with pytest.raises(
        LaunchError, match="flags.dialect: 'sglang': the sim engine speaks vLLM's wire; to simulate sglang"
    ):
        get_driver("sim").argv(spec(flags={"dialect": "sglang"}))


def test_ollama_is_never_launched() -> None:
    driver = get_driver("ollama")
    assert not driver.launchable and driver.serves_many_models and driver.can_unload and driver.default_port == 11434
    with pytest.raises(
        Exception, match=r"ollama is a daemon its operator runs \('ollama serve'\); opod does not launch it"
    ):
        driver.argv(spec(model="llama3.2:3b"))


def recorder(calls: list[tuple[str, str, object]], answer: object, status: int = 200):
    async def handler(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        calls.append((request.method, request.path_qs, body))
        return web.json_response(answer, status=status)

    return handler


async def test_vllm_sleep_wake_and_tokenize(session: aiohttp.ClientSession) -> None:
    driver, calls = get_driver("vllm"), []
    routes = {
        ("POST", "/sleep"): recorder(calls, {"status": "sleeping", "level": 1}),
        ("POST", "/wake_up"): recorder(calls, {"status": "awake", "tags": None}),
        ("GET", "/is_sleeping"): recorder(calls, {"is_sleeping": True}),
        ("POST", "/tokenize"): recorder(
            calls, {"count": 3, "max_model_len": 2048, "tokens": [1, 2, 3], "token_strs": None}
        ),
    }
    async with fake_engine(routes) as base:
        await driver.sleep(session, base)
        assert await driver.is_sleeping(session, base)
        await driver.resume(session, base)
        msgs = [nodeapi.TokenizeMessage(role="user", content="Hi")]
        assert await driver.tokenize(
            session, base, nodeapi.TokenizeRequest(model="m1", messages=msgs, max_tokens=2)
        ) == [1, 2]
        assert await driver.tokenize(session, base, nodeapi.TokenizeRequest(prompt="Hi")) == [1, 2, 3]
    assert [c[:2] for c in calls] == [
        ("POST", "/sleep?level=1"),
        ("GET", "/is_sleeping"),
        ("POST", "/wake_up"),
        ("POST", "/tokenize"),
        ("POST", "/tokenize"),
    ]
    assert calls[3][2] == {
        "model": "m1",
        "messages": [{"role": "user", "content": "Hi"}],
        "add_generation_prompt": True,
    }
    assert calls[4][2] == {"prompt": "Hi"}


async def test_vllm_sleep_without_dev_mode_says_how_to_enable_it(session: aiohttp.ClientSession) -> None:
    async with fake_engine({("GET", "/health"): recorder([], {})}) as base:
        with pytest.raises(EngineCallError, match="HTTP 404.*start the worker with OPOD_SLEEP_MODE=1"):
            await get_driver("vllm").sleep(session, base)


async def test_llamacpp_tokenize_applies_the_template_first(session: aiohttp.ClientSession) -> None:
    calls: list = []
    routes = {
        ("POST", "/apply-template"): recorder(calls, {"prompt": "<|im_start|>user\nHi<|im_end|>\n"}),
        ("POST", "/tokenize"): recorder(calls, {"tokens": [5, 6, 7, 8]}),
    }
    async with fake_engine(routes) as base:
        msgs = [nodeapi.TokenizeMessage(role="user", content="Hi")]
        assert await get_driver("llamacpp").tokenize(session, base, nodeapi.TokenizeRequest(messages=msgs)) == [
            5,
            6,
            7,
            8,
        ]
    assert calls[0][2] == {"messages": [{"role": "user", "content": "Hi"}]}
    assert calls[1][2] == {"content": "<|im_start|>user\nHi<|im_end|>\n", "add_special": True, "parse_special": True}


async def test_slots_come_from_props_and_server_info(session: aiohttp.ClientSession) -> None:
    async with fake_engine({("GET", "/props"): recorder([], {"total_slots": 6})}) as base:
        assert await get_driver("llamacpp").slots(session, base) == 6
    async with fake_engine({}) as base:  # an engine that does not say: what the spec asked for
        assert await get_driver("llamacpp").slots(session, base, spec(parallel=3)) == 3
        assert await get_driver("llamacpp").slots(session, base) is None
    info = {
        "max_running_requests": None,
        "internal_states": [{"max_running_requests": 48}, {"max_running_requests": 48}],
    }
    async with fake_engine({("GET", "/get_server_info"): recorder([], info)}) as base:
        assert await get_driver("sglang").slots(session, base) == 96
    assert await get_driver("vllm").slots(session, "http://127.0.0.1:1", spec(flags={"max_num_seqs": 12})) == 12


async def test_ollama_load_unload_and_residency(session: aiohttp.ClientSession) -> None:
    driver, calls = get_driver("ollama"), []
    tags = {"models": [{"name": "llama3.2:3b", "size": 1}, {"name": "qwen3:8b", "size": 2}]}
    ps = {"models": [{"name": "qwen3:8b", "model": "qwen3:8b", "size_vram": 0}]}
    routes = {
        ("GET", "/api/version"): recorder(calls, {"version": "0.12.6"}),
        ("GET", "/api/tags"): recorder(calls, tags),
        ("GET", "/api/ps"): recorder(calls, ps),
        ("POST", "/api/generate"): recorder(calls, {"done": True}),
    }
    async with fake_engine(routes) as base:
        assert await driver.served_models(session, base) == ["llama3.2:3b", "qwen3:8b"]
        assert await driver.resident_models(session, base) == ["qwen3:8b"]
        await driver.load(session, base, "llama3.2:3b", pin=True)
        await driver.load(session, base, "qwen3:8b")
        await driver.unload(session, base, "qwen3:8b")
        sample = await driver.sample(session, base, None)
        assert sample is not None and sample[0].kv_used_pct is None and sample[0].tokens_per_s is None
    bodies = [c[2] for c in calls if c[1] == "/api/generate"]
    assert bodies == [
        {"model": "llama3.2:3b", "keep_alive": -1, "stream": False},
        {"model": "qwen3:8b", "keep_alive": "5m", "stream": False},
        {"model": "qwen3:8b", "keep_alive": 0, "stream": False},
    ]
    assert await driver.sample(session, "http://127.0.0.1:1", None) is None
    assert [driver.canonical_model_name(n) for n in ("qwen3", "qwen3:8b", "hf.co/u/m", "reg:5000/u/m")] == [
        "qwen3:latest",
        "qwen3:8b",
        "hf.co/u/m:latest",
        "reg:5000/u/m:latest",
    ]


async def test_engines_that_hold_one_model_refuse_load_and_unload(session: aiohttp.ClientSession) -> None:
    for name in ("llamacpp", "vllm", "sglang", "sim"):
        driver = get_driver(name)
        assert not driver.serves_many_models and not driver.can_unload
        with pytest.raises(NotImplementedError, match="start another engine"):
            await driver.load(session, "http://127.0.0.1:1", "x")
        with pytest.raises(NotImplementedError, match="stop the engine process"):
            await driver.unload(session, "http://127.0.0.1:1", "x")


async def test_vllm_lora_calls_pass_the_engines_refusal_and_explain_a_missing_route(
    session: aiohttp.ClientSession,
) -> None:
    driver = get_driver("vllm")
    routes = {
        ("POST", "/v1/load_lora_adapter"): status(
            400, '{"error":{"message":"The lora adapter \'m1:a\' has already been loaded."}}'
        ),
        ("POST", "/v1/unload_lora_adapter"): status(200, "Success: LoRA adapter 'm1:a' removed successfully."),
    }
    async with fake_engine(routes) as url:
        with pytest.raises(EngineCallError, match="already been loaded") as caught:
            await driver.attach_adapter(session, url, "m1:a", "/a")
        assert caught.value.status == 400
        await driver.detach_adapter(session, url, "m1:a")  # a plain-text success is a success
    async with fake_engine({}) as url:  # started without runtime LoRA: the routes are not there
        with pytest.raises(
            EngineCallError, match="started without runtime LoRA .give the worker the plan flag max_lora_rank"
        ) as caught:
            await driver.attach_adapter(session, url, "m1:a", "/a")
        assert caught.value.status == 0


def test_vllm_and_sglang_start_with_tool_calling_when_the_catalog_names_the_models_parser() -> None:
    vllm, sglang = get_driver("vllm"), get_driver("sglang")
    with_tools = vllm.argv(spec(model="Qwen/Qwen3-8B", tool_call_parser="hermes"))
    assert (
        with_tools[with_tools.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in with_tools
    )
    assert "--tool-call-parser" not in vllm.argv(spec(model="Qwen/Qwen3-8B")), "no parser named: no tool calling"
    assert "--tool-call-parser" not in vllm.argv(spec(model="BAAI/bge-m3", embeddings=True, tool_call_parser="hermes"))
    argv = sglang.argv(spec(model="Qwen/Qwen3-8B", tool_call_parser="qwen25"))
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen25"
