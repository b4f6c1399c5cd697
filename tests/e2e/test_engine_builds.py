"""An operator chooses engine builds for a node through ``POST /api/v1/nodes/{id}/engines``; the node installs and uses them.

A real leader and a real ``opod join`` worker with the llama.cpp engine. The worker's own llama.cpp
route is an operator's binary that cannot serve (``OPOD_LLAMA_SERVER``), so a model that serves shows
the chosen portable route took over. vLLM builds are installed by real pip from a tiny local wheel.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.ports import free_port
from opod.engines import llama_binary
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, clean_env, descendants, wait_until
from tests.support.tiny_wheel import write_wheel

pytestmark = pytest.mark.engine

NODE = "n_llama"
CHAT = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Leader, OpodProcess, Path]]:
    root = tmp_path_factory.mktemp("builds")
    leader = Leader(root / "leader")
    broken = root / "broken-llama-server"
    broken.write_text(f"#!/bin/sh\necho started >> {root / 'override-ran'}\nexit 3\n")
    broken.chmod(0o755)
    wheels, site = root / "wheels", root / "site"
    write_wheel(wheels / "cpu", "vllm", "0.0.1")
    site.mkdir()
    install = (
        f"{{python}} -m pip install --no-deps --no-index --disable-pip-version-check --find-links {wheels}/{{build}} "
        f"--target {site} {{package}}"
    )
    args = [
        "join",
        leader.url,
        "--token",
        leader.node_token(),
        "--engine",
        "llamacpp",
        "--listen",
        f"127.0.0.1:{free_port()}",
    ]
    env = clean_env(
        root / NODE,
        OPOD_NODE_ID=NODE,
        OPOD_LLAMA_SERVER=str(broken),
        OPOD_ENGINE_INSTALL_COMMAND=install,
        PYTHONPATH=str(site),
    )
    worker = OpodProcess(args, root / NODE, env=env)
    worker.wait_for_line("registered with", timeout=30)
    yield leader, worker, root
    worker.stop()
    leader.stop()


def provision(leader: Leader, engine: str) -> dict:
    status, body = leader.admin("GET", "/api/v1/nodes")
    assert status == 200, body
    view = next(n for n in body if n["id"] == NODE)
    return next((row for row in view.get("provision", []) if row["engine"] == engine), {})


def choose(leader: Leader, engine: str, build: str) -> None:
    status, body = leader.admin("POST", f"/api/v1/nodes/{NODE}/engines", {"engine": engine, "build": build})
    assert (status, body) == (200, {"engine": engine, "build": build})


def shown(leader: Leader, engine: str, **want: str) -> dict:
    return wait_until(
        lambda: (row := provision(leader, engine)) and all(row.get(k) == v for k, v in want.items()) and row,
        20,
        f"{engine} provision {want}",
    )


def test_the_leader_refuses_a_build_no_node_could_install(node) -> None:
    leader, _, _ = node
    status, body = leader.admin("POST", f"/api/v1/nodes/{NODE}/engines", {"engine": "llamacpp", "build": "cu129"})
    assert (
        status == 400
        and body["error"]
        == "build: 'cu129' is not a build of llamacpp; choose one of auto, none, override, prebuilt, portable"
    )
    status, body = leader.admin("POST", f"/api/v1/nodes/{NODE}/engines", {"engine": "llama-cpp", "build": "auto"})
    assert (status, body) == (200, {"engine": "llamacpp", "build": "auto"}), "an alias names the engine by its id"


def test_portable_is_installed_and_the_next_model_runs_on_it(node) -> None:
    leader, worker, root = node
    assert provision(leader, "llamacpp")["variant"] == "override"
    choose(leader, "llamacpp", "portable")
    shown(leader, "llamacpp", variant="portable", state="ready")
    assert leader.admin("POST", f"/api/v1/presets/{CHAT}") == (200, {"added": CHAT})
    assert leader.admin("POST", f"/api/v1/models/{CHAT}/load", {"node": NODE})[0] == 200
    leader.wait_served(CHAT, timeout=60)
    argvs = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in descendants(worker.proc.pid)]
    assert any(b"opod.engines.xllama" in argv and CHAT.encode() in argv for argv in argvs), argvs
    assert not (root / "override-ran").exists(), "the operator's own binary was never started"


def test_none_makes_the_engine_unsupported_here(node) -> None:
    leader, _, _ = node
    choose(leader, "llamacpp", "none")
    row = shown(leader, "llamacpp", state="unsupported")
    assert row["detail"] == "the operator chose no build of llamacpp here"
    choose(leader, "llamacpp", "portable")
    shown(leader, "llamacpp", variant="portable", state="ready")


def test_prebuilt_is_used_only_where_the_cpu_runs_it(node) -> None:
    leader, _, _ = node
    choose(leader, "llamacpp", "prebuilt")
    if llama_binary.prebuilt_binary() is not None and llama_binary.prebuilt_fits(llama_binary.cpu_flags()):
        shown(leader, "llamacpp", variant="prebuilt", state="ready")
    else:
        row = shown(leader, "llamacpp", variant="prebuilt", state="failed")
        assert row["detail"].endswith("; llamacpp keeps the portable build"), row
        reason = (
            "prebuilt needs CPU flags this CPU lacks"
            if llama_binary.prebuilt_binary()
            else "the prebuilt llama-server is not installed"
        )
        assert reason in row["detail"], row


def test_a_pip_build_fails_with_pips_last_line_then_another_installs(node) -> None:
    leader, _, _ = node
    assert provision(leader, "vllm")["state"] == "unsupported"
    choose(leader, "vllm", "cu129")
    row = shown(leader, "vllm", variant="cu129", state="failed")
    assert row["detail"].startswith(
        "installing vllm cu129 failed (exit 1): ERROR: No matching distribution found for vllm"
    ), row
    choose(leader, "vllm", "cpu")
    row = shown(leader, "vllm", variant="cpu", state="ready")
    assert row["version"] == "0.0.1", row
