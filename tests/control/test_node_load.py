"""A node view's ``load`` and ``provision`` from what its worker last reported, without a process.

The listing keeps each node's JSON between two GETs; these check that the load's ``age_seconds``
and the view's ``last_seen_ago`` are still written afresh into what is kept, and that a new
heartbeat's load replaces the kept one.
"""

from __future__ import annotations

import json
import time

from opod.contract import nodeapi
from opod.control.node_views import NodeList, load_view
from opod.fleet.inventory import apply_report
from opod.fleet.state import NodeState


def node() -> NodeState:
    n = NodeState(id="n1", address="127.0.0.1:1", hardware=nodeapi.Capabilities(cpu_cores=96, ram_gb=1024))
    n.host_load = nodeapi.HostLoad(
        cpus=4,
        cpu_percent=25.0,
        load1=1.0,
        load5=0.5,
        load15=0.25,
        memory_used_bytes=2 << 30,
        memory_total_bytes=8 << 30,
        gpus=[nodeapi.GPUSensor(index=0, temp_c=60.0, ecc_uncorrected=0, pcie_replays=2)],
    )
    n.host_load_at = time.time() - 3
    n.inventory.last_seen = time.time() - 3
    apply_report(
        n.inventory,
        nodeapi.InventoryReport(
            provision=[
                nodeapi.EngineInstall(engine="vllm", state="unsupported", detail="not installed: pip install vllm")
            ]
        ),
        None,
    )
    return n


def test_the_load_view_is_the_reported_host_with_its_age_and_gpu_wear() -> None:
    n = node()
    view = load_view(n, time.time())
    assert (view.cpus, view.cpu_percent, view.memory_percent, view.age_seconds) == (4, 25.0, 25.0, 3)
    sensor = view.gpu_sensors[0]
    assert sensor.temp_c == 60.0 and sensor.ecc_uncorrected == 0 and sensor.wear.pcie_replays == 2
    n.host_load = None
    before = load_view(n, time.time())
    assert (before.cpus, before.memory_total_bytes, before.age_seconds) == (96, 1024 << 30, None)


def test_the_kept_listing_writes_the_ages_afresh_and_takes_a_new_report() -> None:
    n, listing = node(), NodeList()
    now = time.monotonic()
    first = json.loads(listing.json([n], {}, now, time.time()))[0]
    assert first["load"]["age_seconds"] == 3 and first["last_seen_ago"] == "3s"
    assert first["provision"] == [
        {"engine": "vllm", "state": "unsupported", "detail": "not installed: pip install vllm"}
    ]
    later = json.loads(listing.json([n], {}, now, time.time() + 10))[0]
    assert later["load"]["age_seconds"] == 13 and later["last_seen_ago"] == "13s"
    assert {k: v for k, v in later.items() if k not in ("load", "last_seen_ago")} == {
        k: v for k, v in first.items() if k not in ("load", "last_seen_ago")
    }
    n.host_load, n.host_load_at = (
        nodeapi.HostLoad(cpus=4, load1=3.0, memory_used_bytes=1, memory_total_bytes=2),
        time.time(),
    )
    fresh = json.loads(listing.json([n], {}, now, time.time()))[0]
    assert fresh["load"]["load1"] == 3.0 and fresh["load"]["age_seconds"] == 0 and "cpu_percent" not in fresh["load"]
