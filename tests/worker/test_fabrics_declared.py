"""Fabrics and NVLink in a declared inventory, and NVLink peers read through NVML: what the worker reports, each bad input named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from opod.contract import nodeapi
from opod.worker import declared
from opod.worker.declared import InventoryError
from opod.worker.inventory import nvidia_devices, take

WIRED = """
gpus:
  - {name: NVIDIA H100 80GB HBM3, class: H100-80GB, memory_gb: 80, count: 4, nvlink_peers: [0, 1, 2, 3]}
  - {name: NVIDIA H100 80GB HBM3, class: H100-80GB, memory_gb: 80, count: 2, nvlink_peers: [4, 5]}
  - {name: NVIDIA L4, memory_gb: 24}
fabrics:
  - {name: ib-a, adapters: [mlx5_0, mlx5_1]}
  - name: ib-b
    adapters: [mlx5_2, {name: mlx5_3, state: down}]
"""


def peers(parsed: declared.Declared) -> dict[int, list[int] | None]:
    return {g.card: g.nvlink_peers for g in parsed.gpus}


def test_nvlink_peers_link_the_cards_of_an_entry_both_ways_and_fabrics_keep_each_adapters_state() -> None:
    parsed = declared.parse(declared.yaml.safe_load(WIRED))
    assert peers(parsed) == {0: [1, 2, 3], 1: [0, 2, 3], 2: [0, 1, 3], 3: [0, 1, 2], 4: [5], 5: [4], 6: None}
    assert parsed.fabrics == {
        "ib-a": {"mlx5_0": "active", "mlx5_1": "active"},
        "ib-b": {"mlx5_2": "active", "mlx5_3": "down"},
    }


def test_a_link_written_on_one_card_is_a_link_of_both() -> None:
    parsed = declared.parse(
        {"gpus": [{"name": "A", "memory_gb": 24, "nvlink_peers": [2]}, {"name": "A", "memory_gb": 24, "count": 2}]}
    )
    assert peers(parsed) == {0: [2], 1: None, 2: [0]}


def test_nvlink_all_links_every_whole_card_and_a_domain_is_joined_by_each() -> None:
    parsed = declared.parse(
        {
            "gpus": [
                {"name": "GB200", "memory_gb": 186, "count": 4},
                {"name": "A100", "memory_gb": 80, "mig": [{"profile": "3g.40gb", "memory_gb": 40}]},
            ],
            "nvlink": "all",
            "nvlink_domain": "nvl72-a",
            "fabrics": [{"name": "roce", "adapters": ["eth2"], "state": "down"}],
        }
    )
    whole = [g for g in parsed.gpus if not g.mig_profile]
    assert [g.nvlink_peers for g in whole] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    assert {(g.nvlink_domain, g.fabric_state) for g in whole} == {("nvl72-a", "joined")}
    mig = [g for g in parsed.gpus if g.mig_profile]
    assert mig[0].nvlink_peers is None and mig[0].nvlink_domain == ""
    assert parsed.fabrics == {"roce": {"eth2": "down"}}


def test_the_worker_reports_fabrics_and_wiring_on_the_wire(tmp_path: Path) -> None:
    inventory = take(tmp_path, declared.parse(declared.yaml.safe_load(WIRED)))
    report = inventory.report("sim")
    wire = nodeapi.InventoryReport.model_validate_json(report.to_json())
    assert wire.fabrics == {
        "ib-a": {"mlx5_0": "active", "mlx5_1": "active"},
        "ib-b": {"mlx5_2": "active", "mlx5_3": "down"},
    }
    assert wire.gpus is not None and wire.gpus[4].nvlink_peers == [5]
    bare = take(tmp_path, declared.parse({"gpus": [{"name": "L4", "memory_gb": 24}]})).report("sim").to_json()
    assert "fabrics" not in bare and "nvlink" not in bare and "fabric_state" not in bare


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"nvlink": "some"}, "nvlink: 'some': write all"),
        (
            {"gpus": [{"name": "A", "memory_gb": 8, "count": 2, "nvlink_peers": [1]}], "nvlink": "all"},
            "gpus[0].nvlink_peers: nvlink: all already links every card",
        ),
        (
            {"gpus": [{"name": "A", "memory_gb": 8, "nvlink_peers": []}]},
            "gpus[0].nvlink_peers: must be a non-empty list",
        ),
        (
            {"gpus": [{"name": "A", "memory_gb": 8, "nvlink_peers": "1,2"}]},
            "gpus[0].nvlink_peers: must be a non-empty list",
        ),
        (
            {"gpus": [{"name": "A", "memory_gb": 8, "count": 2, "nvlink_peers": [0, 5]}]},
            "gpus[0].nvlink_peers[1]: 5 is not a card; the whole cards are 0, 1",
        ),
        (
            {"gpus": [{"name": "A", "memory_gb": 8, "nvlink_peers": [True]}]},
            "gpus[0].nvlink_peers[0]: True is not a card",
        ),
        (
            {
                "gpus": [
                    {
                        "name": "A",
                        "memory_gb": 80,
                        "mig": [{"profile": "3g.40gb", "memory_gb": 40}],
                        "nvlink_peers": [0],
                    }
                ]
            },
            "gpus[0].nvlink_peers: a card in MIG mode has no NVLink peers",
        ),
        (
            {
                "gpus": [
                    {"name": "A", "memory_gb": 80, "nvlink_peers": [1]},
                    {"name": "A", "memory_gb": 80, "mig": [{"profile": "3g.40gb", "memory_gb": 40}]},
                ]
            },
            "gpus[0].nvlink_peers[0]: card 1 is in MIG mode",
        ),
        ({"nvlink_domain": "nvl72"}, "nvlink_domain: no whole card to join it"),
        (
            {"gpus": [{"name": "A", "memory_gb": 8}], "nvlink_domain": "no spaces"},
            "nvlink_domain: 'no spaces' is not an NVLink domain name",
        ),
        ({"fabrics": {"ib-a": ["mlx5_0"]}}, "fabrics: must be a list of fabrics"),
        ({"fabrics": [{"adapters": ["mlx5_0"]}]}, "fabrics[0].name: required"),
        ({"fabrics": [{"name": "ib a", "adapters": ["mlx5_0"]}]}, "fabrics[0].name: 'ib a' is not a fabric name"),
        ({"fabrics": [{"name": "ib-a"}]}, "fabrics[0].adapters: required: a non-empty list"),
        ({"fabrics": [{"name": "ib-a", "adapters": []}]}, "fabrics[0].adapters: required: a non-empty list"),
        ({"fabrics": [{"name": "ib-a", "adapters": ["mlx5_0"], "speed": 400}]}, "fabrics[0]: unknown field 'speed'"),
        (
            {"fabrics": [{"name": "ib-a", "adapters": ["mlx5_0"], "state": "up"}]},
            "fabrics[0].state: 'up': write active",
        ),
        (
            {"fabrics": [{"name": "ib-a", "adapters": [{"name": "mlx5_0", "state": "flaky"}]}]},
            "fabrics[0].adapters[0].state: 'flaky'",
        ),
        ({"fabrics": [{"name": "ib-a", "adapters": [{"state": "down"}]}]}, "fabrics[0].adapters[0].name: required"),
        ({"fabrics": [{"name": "ib-a", "adapters": [7]}]}, "fabrics[0].adapters[0]: 7 is not an adapter name"),
        (
            {"fabrics": [{"name": "ib-a", "adapters": ["mlx5_0"]}, {"name": "ib-a", "adapters": ["mlx5_1"]}]},
            "fabrics[1].name: fabric 'ib-a' is declared twice",
        ),
        (
            {"fabrics": [{"name": "ib-a", "adapters": ["mlx5_0"]}, {"name": "ib-b", "adapters": ["mlx5_0"]}]},
            "fabrics[1].adapters[0]: adapter 'mlx5_0' is already on fabric 'ib-a'",
        ),
    ],
)
def test_bad_wiring_is_refused_naming_the_field(data: dict, named: str) -> None:
    with pytest.raises(InventoryError) as err:
        declared.parse(data, "inv.yaml")
    assert f"inv.yaml: {named}" in str(err.value)


class _PCI:
    def __init__(self, bus: int) -> None:
        self.domain, self.bus, self.device = 0, bus, 0


class _WiredNVML:
    """A stand-in for the NVML library (not opod's): cards 0 and 1 linked directly, cards 2 and 3 through an NVSwitch."""

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    class _Memory:
        total = 81920 << 20

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _Memory:
        return self._Memory()

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        return (0, 0)

    def nvmlDeviceGetPciInfo(self, h: int) -> _PCI:
        return _PCI(0x10 + h)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 2:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> _PCI:
        if h in (0, 1):
            return _PCI(0x10 + (1 - h))
        return _PCI(0x80 + link)  # an NVSwitch, not a card

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, caps: int) -> int:
        return 0 if {a, b} == {2, 3} else 4


def test_nvml_nvlink_peers_map_remote_pci_to_cards_and_switches_to_p2p(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _WiredNVML())
    devices, warnings = nvidia_devices()
    assert warnings == ()
    assert {d.card: d.nvlink_peers for d in devices} == {0: [1], 1: [0], 2: [3], 3: [2]}
    assert {d.nvlink_domain for d in devices} == {""}  # no GPU fabric info: in no multi-node domain
