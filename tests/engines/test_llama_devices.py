"""Whether llama.cpp can use the machine's GPUs: the binaries' own device lists, and the warning when it cannot."""

from __future__ import annotations

import sys

import pytest

from opod.contract import nodeapi
from opod.engines import llama_binary
from opod.engines.llama_devices import list_devices, parse_devices, unused_gpus_warning

H200 = nodeapi.GPU(name="NVIDIA H200", vram_gb=140)
# What the bundled llama-server printed on an H200 machine with and without libglvnd installed.
SEES_THE_CARD = "Available devices:\n  Vulkan0: NVIDIA H200 (143771 MiB, 143139 MiB free)\n"
SEES_NONE = "Available devices:\n  (none)\n"


def test_device_lists_are_read_from_llama_servers_text() -> None:
    assert parse_devices(SEES_THE_CARD) == ["Vulkan0: NVIDIA H200 (143771 MiB, 143139 MiB free)"]
    assert parse_devices("load_backend: loaded Vulkan backend\n" + SEES_THE_CARD + "main: exiting\n") == [
        "Vulkan0: NVIDIA H200 (143771 MiB, 143139 MiB free)"
    ]
    assert parse_devices(SEES_NONE) == []
    assert parse_devices("error: unknown argument: --list-devices") is None


def test_the_warning_names_the_cards_and_the_fix_only_when_llama_cpp_sees_none() -> None:
    warning = unused_gpus_warning([H200, H200], [], "the prebuilt llama-server")
    assert warning is not None
    for part in (
        "2 GPUs (NVIDIA H200)",
        "the prebuilt llama-server",
        "run on the CPU",
        "libglvnd0",
        "--list-devices",
        "OPOD_LLAMA_SERVER",
    ):
        assert part in warning
    assert unused_gpus_warning([H200], parse_devices(SEES_THE_CARD), "x") is None
    assert unused_gpus_warning([], [], "x") is None  # no GPUs: nothing to miss
    assert unused_gpus_warning([H200], None, "x") is None  # the binary could not say: no guess


@pytest.mark.engine
@pytest.mark.parametrize("route", ["resolved", "portable"])
def test_the_real_binaries_list_their_devices(route: str) -> None:
    if route == "portable":
        pytest.importorskip("xllamacpp", reason="the portable route needs the xllamacpp wheel")
        argv = llama_binary.portable_route().argv
        assert argv[0] == sys.executable
    else:
        argv = llama_binary.resolve().argv
    devices = list_devices(argv)
    assert devices is not None, f"{' '.join(argv)} --list-devices gave no device list"
    if not devices:  # a machine without a GPU llama.cpp can use, like CI's: a worker here with an H200 would warn
        assert "run on the CPU" in (unused_gpus_warning([H200], devices, "x") or "")


def test_the_portable_launcher_lists_accelerators_as_llama_server_does() -> None:
    from opod.engines.xllama import device_list

    cpu = {
        "name": "CPU",
        "description": "AMD EPYC",
        "memory_total": 24 << 30,
        "memory_free": 20 << 30,
        "type": "GGML_BACKEND_DEVICE_TYPE_CPU",
    }
    gpu = {
        "name": "CUDA0",
        "description": "NVIDIA H200",
        "memory_total": 143771 << 20,
        "memory_free": 143139 << 20,
        "type": "GGML_BACKEND_DEVICE_TYPE_GPU",
    }
    assert parse_devices(device_list([cpu, gpu])) == ["CUDA0: NVIDIA H200 (143771 MiB, 143139 MiB free)"]
    assert parse_devices(device_list([cpu])) == []
