"""A declared inventory: GPUs, MIG instances, unhealthy devices and labels from a file, each problem naming its field."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from opod.worker import declared
from opod.worker.declared import InventoryError
from opod.worker.inventory import take
from tests.support.opod_process import OPOD, clean_env

FLEET = """
gpus:
  - name: NVIDIA H100 80GB HBM3
    class: H100-80GB
    memory_gb: 80
    compute_capability: "9.0"
    count: 8
  - name: NVIDIA A100-SXM4-80GB
    class: A100-80GB
    memory_gb: 80
    compute_capability: "8.0"
    mig:
      - {profile: 3g.40gb, memory_gb: 40}
      - {profile: 2g.20gb, memory_gb: 20, count: 2}
unhealthy:
  "3": "XID 79: fell off the bus"
labels:
  llmgw.io/site: par1
  llmgw.io/rack: r12
cpu_cores: 96
memory_gb: 1024
"""


def test_cards_come_first_and_mig_instances_after_each_as_its_own_device(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(FLEET)
    stated = declared.load(path)
    labels = [g.label for g in stated.gpus]
    assert labels == [str(i) for i in range(8)] + ["8/mig0", "8/mig1", "8/mig2"]
    mig = stated.gpus[8]
    assert (mig.index, mig.card, mig.gpu_class, mig.mig_profile, mig.memory_mb) == (
        9,
        8,
        "A100-80GB/3g.40gb",
        "3g.40gb",
        40 * 1024,
    )
    assert [g.gpu_class for g in stated.gpus[9:]] == ["A100-80GB/2g.20gb"] * 2
    assert stated.gpus[3].healthy is False and stated.gpus[3].why == "XID 79: fell off the bus"
    assert stated.labels == {"llmgw.io/site": "par1", "llmgw.io/rack": "r12"}
    assert [g.vram_gb for g in take(tmp_path / "h", stated).gpus] == [80] * 9
    machine = take(tmp_path / "home", stated)
    assert (machine.cpu_cores, machine.ram_gb, machine.declared, len(machine.gpus), len(machine.devices)) == (
        96,
        1024,
        True,
        9,
        11,
    )


def test_json_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    path.write_text('{"gpus": [{"name": "NVIDIA L4", "memory_mb": 23034, "count": 2}]}')
    stated = declared.load(path)
    assert [(g.label, g.gpu_class, g.memory_mb) for g in stated.gpus] == [
        ("0", "NVIDIA L4", 23034),
        ("1", "NVIDIA L4", 23034),
    ]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("gpus: [{memory_gb: 80}]", "gpus[0].name: required"),
        ("gpus: [{name: H100, memory_gb: -1}]", "gpus[0].memory_gb: must be a positive number"),
        ("gpus: [{name: H100}]", "gpus[0].memory_gb: say the memory once"),
        ("gpus: [{name: H100, memory_gb: 80, count: 0}]", "gpus[0].count: must be a whole number from 1"),
        (
            "gpus: [{name: H100, memory_gb: 80, compute_capability: nine}]",
            "gpus[0].compute_capability: must be MAJOR.MINOR",
        ),
        ("gpus: [{name: H100, memory_gb: 80, colour: red}]", "gpus[0]: unknown field 'colour'"),
        (
            "gpus: [{name: A100, memory_gb: 40, mig: [{profile: 3g.40gb, memory_gb: 40, count: 2}]}]",
            "gpus[0].mig: the instances need",
        ),
        (
            "gpus: [{name: A100, memory_gb: 80, mig: [{profile: big, memory_gb: 10}]}]",
            "gpus[0].mig[0].profile: 'big' is not a MIG profile",
        ),
        (
            "gpus: [{name: H100, memory_gb: 80}]\nunhealthy: {'5': broken}",
            "unhealthy['5']: no such device; the devices are 0",
        ),
        ("labels: {'bad key!': x}", "labels['bad key!']"),
        ("gpu: []", "(top level): unknown field 'gpu'"),
        ("gpus: [{name: H100, memory_gb: 80}", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as refused:
        declared.load(path)
    assert str(refused.value).startswith(f"{path}: ") and named in str(refused.value), str(refused.value)


def test_opod_join_with_a_bad_inventory_stops_with_the_field_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - name: NVIDIA H100\n    memory_gb: 80\n    count: many\n")
    home = tmp_path / "home"
    done = subprocess.run(
        [
            *OPOD,
            "join",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--engine",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--inventory",
            str(bad),
        ],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "gpus[0].count: must be a whole number from 1 to 1024, not 'many'" in done.stderr + done.stdout, done.stderr


class _FakeNVML:
    """A stand-in for the NVML library (not opod's): card 0 whole, card 1 in MIG mode with two instances."""

    NVML_DEVICE_MIG_ENABLE = 1

    class _Memory:
        def __init__(self, mib: int) -> None:
            self.total = mib << 20

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"card{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA A100-SXM4-80GB MIG 3g.40gb" if h.startswith("mig") else b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> _Memory:
        return self._Memory(40960 if h.startswith("mig") else 81920)

    def nvmlDeviceGetCudaComputeCapability(self, h: str) -> tuple[int, int]:
        return (8, 0)

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]:
        return (1 if h == "card1" else 0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, slot: int) -> str:
        if slot == 2:
            raise RuntimeError("empty slot")
        return f"mig{slot}"


def test_nvml_devices_list_mig_instances_after_the_whole_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from opod.worker.inventory import nvidia_devices, nvidia_gpus

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML())
    devices, warnings = nvidia_devices()
    assert warnings == ()
    assert [(d.index, d.label, d.gpu_class, d.memory_mb, d.compute_capability) for d in devices] == [
        (0, "0", "NVIDIA A100-SXM4-80GB", 81920, "8.0"),
        (2, "1/mig0", "NVIDIA A100-SXM4-80GB/3g.40gb", 40960, "8.0"),
        (3, "1/mig1", "NVIDIA A100-SXM4-80GB/3g.40gb", 40960, "8.0"),
    ]
    assert [(g.name, g.vram_gb) for g in nvidia_gpus()] == [
        ("NVIDIA A100-SXM4-80GB", 80),
        ("NVIDIA A100-SXM4-80GB", 80),
    ]
