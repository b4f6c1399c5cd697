"""opod's heartbeat and inventory additions for the node views: the host's load and the engines a worker can run.

Written byte for byte as below, read back to the same value, and absent when not said, so the contract's
own heartbeats (its goldens) stay exactly as they were.
"""

from __future__ import annotations

from opod.contract import nodeapi as n

HEARTBEAT = n.Heartbeat(
    id="n_w0",
    loaded_models=[],
    boot_id="b",
    host_load=n.HostLoad(
        cpus=8,
        cpu_percent=12.5,
        load1=0.5,
        load5=0.25,
        load15=0,
        memory_used_bytes=1 << 30,
        memory_total_bytes=8 << 30,
        cpu_temp_c=48.0,
        gpus=[n.GPUSensor(index=0, temp_c=61.0, power_w=250.5, pcie_replays=0, remap_pending=False)],
    ),
)
GOLDEN = (
    '{"id":"n_w0","loaded_models":[],"boot_id":"b","host_load":{"cpus":8,"cpu_percent":12.5,"load1":0.5,'
    '"load5":0.25,"load15":0,"memory_used_bytes":1073741824,"memory_total_bytes":8589934592,"cpu_temp_c":48,'
    '"gpus":[{"index":0,"temp_c":61,"power_w":250.5,"pcie_replays":0,"remap_pending":false}]}}'
)


def test_the_host_load_is_written_byte_for_byte_and_read_back() -> None:
    assert HEARTBEAT.to_json() == GOLDEN
    assert n.Heartbeat.from_wire(GOLDEN) == HEARTBEAT


def test_not_said_is_absent_and_the_contracts_heartbeat_is_unchanged() -> None:
    assert (
        n.Heartbeat(id="n_w0", loaded_models=[], boot_id="b").to_json()
        == '{"id":"n_w0","loaded_models":[],"boot_id":"b"}'
    )
    assert n.HostLoad().to_json() == "{}"
    assert n.Heartbeat.from_wire('{"id":"a","host_load":{"unknown":1}}').host_load == n.HostLoad()


def test_provision_rides_in_the_inventory_report() -> None:
    report = n.InventoryReport(
        provision=[
            n.EngineInstall(engine="sim", version="0.1.0", variant="simulator", state="ready"),
            n.EngineInstall(engine="vllm", state="unsupported", detail="not installed"),
        ]
    )
    text = report.to_json()
    assert (
        '"provision":[{"engine":"sim","version":"0.1.0","variant":"simulator","state":"ready"},'
        '{"engine":"vllm","state":"unsupported","detail":"not installed"}]' in text
    )
    assert n.InventoryReport.from_wire(text) == report
    assert "provision" not in n.InventoryReport().to_json()
