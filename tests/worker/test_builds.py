"""An operator's engine build choice on one worker: llama.cpp's pinned route, ``none``, and pip installs of a build.

The installs run real pip on a tiny wheel written by the test (no network), or a real command that fails.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import pytest

from opod.contract import nodeapi
from opod.engines import llama_binary
from opod.engines.builds import builds_of
from opod.engines.errors import LaunchError
from opod.worker import provision
from opod.worker.builds import EngineBuilds, install_argv
from tests.support.tiny_wheel import write_wheel

NO_AVX512 = "processor : 0\nflags : fpu sse2 avx avx2 fma\n"
ALL_AVX512 = "processor : 0\nflags : fpu avx2 " + " ".join(sorted(llama_binary.PREBUILT_NEEDS)) + "\n"


def orders(**builds: str) -> nodeapi.HeartbeatResponse:
    return nodeapi.HeartbeatResponse(status="ok", engine_builds=builds or None)


async def installed(builds: EngineBuilds, engine: str, timeout: float = 60.0) -> None:
    """Wait until ``engine``'s install is no longer running."""
    deadline = asyncio.get_running_loop().time() + timeout
    while builds.chosen(engine).state == "installing":
        assert asyncio.get_running_loop().time() < deadline, builds.chosen(engine)
        await asyncio.sleep(0.05)


def test_a_wanted_route_is_pinned_or_refused_with_the_reason() -> None:
    assert llama_binary.resolve({}, NO_AVX512, want=llama_binary.Route.PORTABLE) == llama_binary.portable_route()
    with pytest.raises(LaunchError) as unset:
        llama_binary.resolve({}, NO_AVX512, want=llama_binary.Route.OVERRIDE)
    assert unset.value.field == "build" and "OPOD_LLAMA_SERVER" in unset.value.reason
    if llama_binary.prebuilt_binary() is None:
        pytest.skip("the prebuilt llama-server wheel is not installed on this machine")
    with pytest.raises(LaunchError) as lacking:
        llama_binary.resolve({}, NO_AVX512, want=llama_binary.Route.PREBUILT)
    assert lacking.value.reason.startswith("prebuilt needs CPU flags this CPU lacks: avx512_bf16")
    assert llama_binary.resolve({}, ALL_AVX512, want=llama_binary.Route.PREBUILT).kind is llama_binary.Route.PREBUILT


async def test_portable_pins_the_launch_and_a_refused_prebuilt_keeps_it(tmp_path: Path) -> None:
    changes: list[int] = []
    builds = EngineBuilds(tmp_path, on_change=lambda: changes.append(1), environ={})
    assert builds.launcher("llamacpp") == ()
    builds.heard(orders(llamacpp="portable"))
    assert builds.launcher("llamacpp") == llama_binary.portable_route().argv and changes == [1]
    builds.heard(orders(llamacpp="portable"))
    assert changes == [1], "the same choice heard again is not acted on again"
    rows = {row.engine: row for row in await provision.survey(0, builds, ollama_url="http://127.0.0.1:9")}
    assert (rows["llamacpp"].variant, rows["llamacpp"].state) == ("portable", "ready")

    builds.heard(orders(llamacpp="prebuilt"))
    prebuilt_runs = llama_binary.prebuilt_binary() is not None and llama_binary.prebuilt_fits(llama_binary.cpu_flags())
    row = provision.as_chosen(provision.llamacpp(builds.llama_route()), builds)
    if prebuilt_runs:
        assert (row.variant, row.state) == ("prebuilt", "ready")
    else:
        assert (row.variant, row.state) == ("prebuilt", "failed")
        assert row.detail.endswith("llamacpp keeps the portable build"), row.detail
        assert builds.launcher("llamacpp") == llama_binary.portable_route().argv

    builds.heard(orders())
    assert builds.launcher("llamacpp") == (), "no choice is auto: the worker's own order again"


async def test_none_marks_the_engine_unsupported_and_refuses_its_start(tmp_path: Path) -> None:
    builds = EngineBuilds(tmp_path, environ={})
    builds.heard(orders(llamacpp="none", vllm="none"))
    rows = {row.engine: row for row in await provision.survey(0, builds, ollama_url="http://127.0.0.1:9")}
    for engine in ("llamacpp", "vllm"):
        assert (rows[engine].state, rows[engine].detail) == (
            "unsupported",
            f"the operator chose no build of {engine} here",
        )
    with pytest.raises(LaunchError, match="the operator chose no build of llamacpp here"):
        builds.launcher("llamacpp")
    assert rows["sim"].state == "ready"


def test_the_install_command_fills_its_placeholders_and_names_the_variable_when_malformed() -> None:
    default = install_argv("vllm", "cu129", python="/py", environ={})
    assert default == [
        "/py",
        "-m",
        "pip",
        "install",
        "vllm",
        "--extra-index-url",
        "https://download.pytorch.org/whl/cu129",
    ]
    with pytest.raises(ValueError, match="OPOD_ENGINE_INSTALL_COMMAND=.*only {python}, {package}, {build} and {index}"):
        install_argv("vllm", "cpu", environ={"OPOD_ENGINE_INSTALL_COMMAND": "pip install {pkg}"})
    assert "cu129" in builds_of("vllm") and "portable" in builds_of("llamacpp") and builds_of("sim") == ("auto", "none")


async def test_a_pip_build_installs_once_and_a_restarted_worker_does_not_install_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    write_wheel(wheels / "cpu", "vllm", "0.0.1")
    target.mkdir()
    command = (
        f"{{python}} -m pip install --no-deps --no-index --disable-pip-version-check --find-links {wheels}/{{build}} "
        f"--target {target} {{package}}"
    )
    environ = {"OPOD_ENGINE_INSTALL_COMMAND": command}
    monkeypatch.syspath_prepend(str(target))
    home = tmp_path / "home"
    home.mkdir()
    builds = EngineBuilds(home, environ=environ)

    builds.heard(orders(vllm="cu129"))
    assert builds.chosen("vllm").state == "installing"
    await installed(builds, "vllm")
    failed = builds.chosen("vllm")
    assert failed.state == "failed" and failed.detail.startswith("installing vllm cu129 failed (exit 1): "), failed
    assert "No matching distribution found for vllm" in failed.detail
    builds.heard(orders(vllm="cu129"))
    assert builds.chosen("vllm") == failed, "a failed build is not retried on the next heartbeat"

    builds.heard(orders(vllm="cpu"))
    row = provision.as_chosen(provision.python_engine("vllm", "vllm", "vLLM", 0, "cpu"), builds)
    assert (row.state, row.variant) == ("installing", "cpu")
    await installed(builds, "vllm")
    row = provision.as_chosen(provision.python_engine("vllm", "vllm", "vLLM", 0, "cpu"), builds)
    assert (row.state, row.variant, row.version) == ("ready", "cpu", "0.0.1")

    again = EngineBuilds(home, environ=environ)
    again.heard(orders(vllm="cpu"))
    assert again.chosen("vllm").state == "", "a restarted worker finds the build it installed"


async def test_a_command_that_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    builds = EngineBuilds(
        tmp_path, environ={"OPOD_ENGINE_INSTALL_COMMAND": str(tmp_path / "no-such-pip") + " install {package}"}
    )
    builds.heard(orders(sglang="cu128"))
    await installed(builds, "sglang")
    assert builds.chosen("sglang").state == "failed" and "could not be started" in builds.chosen("sglang").detail


async def test_a_new_choice_stops_the_install_still_running(tmp_path: Path) -> None:
    slow = shlex.join([sys.executable, "-c", "import time; time.sleep(30)"])
    builds = EngineBuilds(tmp_path, environ={"OPOD_ENGINE_INSTALL_COMMAND": slow + " {package}"})
    builds.heard(orders(vllm="cu129"))
    await asyncio.sleep(0.3)
    builds.heard(orders(vllm="auto"))
    await asyncio.sleep(0.3)
    assert builds.chosen("vllm").build == "auto" and builds.chosen("vllm").state == ""


def test_a_build_this_worker_does_not_know_is_shown_failed_once(tmp_path: Path) -> None:
    changes: list[int] = []
    builds = EngineBuilds(tmp_path, on_change=lambda: changes.append(1), environ={})
    builds.heard(orders(llamacpp="portable"))
    builds.heard(orders(llamacpp="vulkan2"))
    builds.heard(orders(llamacpp="vulkan2"))
    assert changes == [1, 1] and builds.chosen("llamacpp").state == "failed"
    assert builds.chosen("llamacpp").detail.startswith("this worker knows no build 'vulkan2' of llamacpp")
    assert builds.launcher("llamacpp") == llama_binary.portable_route().argv


def dies_of_sigill(tmp_path: Path) -> tuple[Path, Path]:
    """A llama-server that dies with SIGILL at start, as the prebuilt one does on a CPU without its instructions,
    and the file each of its runs adds a line to."""
    runs = tmp_path / "runs"
    binary = tmp_path / "llama-server"
    binary.write_text(
        f"#!{sys.executable}\nimport os, signal\n"
        f"open({str(runs)!r}, 'a').write('run\\n')\nos.kill(os.getpid(), signal.SIGILL)\n"
    )
    binary.chmod(0o755)
    return binary, runs


def test_a_route_that_died_with_sigill_is_skipped_until_the_cpu_or_the_binary_changes(tmp_path: Path) -> None:
    binary, _ = dies_of_sigill(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    environ = {"OPOD_LLAMA_SERVER": str(binary)}
    EngineBuilds(home, environ=environ).died_of_sigill("llamacpp", (str(binary),))

    restarted = EngineBuilds(home, environ=environ)  # the next start of the worker
    assert restarted.launcher("llamacpp") == llama_binary.portable_route().argv
    route = restarted.llama_route()
    assert route is not None and route.kind is llama_binary.Route.PORTABLE and "died with SIGILL" in route.why
    assert restarted.launcher("sim") == ()

    other = llama_binary.LlamaRoute(llama_binary.Route.OVERRIDE, (str(binary),), "")
    assert llama_binary.fingerprint(other, NO_AVX512) != llama_binary.fingerprint(other, ALL_AVX512), "another CPU"
    binary.write_text(binary.read_text() + "# upgraded\n")
    assert EngineBuilds(home, environ=environ).launcher("llamacpp") == (), "another binary is tried again"


@pytest.mark.engine
async def test_a_worker_that_fell_back_from_a_sigill_starts_on_the_portable_build_at_once_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opod.catalog import load_catalog
    from opod.weights.tiny import write_tiny_llama
    from opod.worker.engines import EngineManager
    from opod.worker.supervisor import Supervisor

    pytest.importorskip("xllamacpp", reason="the portable route needs the xllamacpp wheel")
    binary, runs = dies_of_sigill(tmp_path)
    monkeypatch.setenv("OPOD_LLAMA_SERVER", str(binary))
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    home = tmp_path / "home"
    home.mkdir()

    async def start_and_serve() -> str:
        """One start of a worker: its builds and engines as ``open_worker`` wires them; the launch its engine served on."""
        builds = EngineBuilds(home)
        manager = EngineManager(
            engine_id="llamacpp",
            home=home,
            catalog=load_catalog(),
            supervisor=Supervisor(),
            threads=2,
            launcher=builds.launcher,
            died_of_sigill=builds.died_of_sigill,
        )
        try:
            await manager.load(nodeapi.LoadModelRequest(id="tiny", path=str(gguf)))
            engine = manager.engines["tiny"]
            for _ in range(1200):
                if engine.state in ("serving", "failed"):
                    break
                await asyncio.sleep(0.05)
            assert engine.state == "serving", engine.detail
            assert engine.spec is not None
            return " ".join(engine.spec.launcher)
        finally:
            await manager.stop_all()

    portable = " ".join(llama_binary.portable_route().argv)
    assert await start_and_serve() == portable
    assert runs.read_text().count("run") == 1, "the first start crashed once, then fell back"
    assert await start_and_serve() == portable
    assert runs.read_text().count("run") == 1, "the next start went to the portable build without crashing first"
