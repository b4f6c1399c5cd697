"""An update's takeover waits for what was already sent to the model's old replicas, not a fixed time."""

from __future__ import annotations

import asyncio
import time

from opod.contract import nodeapi
from opod.control.update_steps import drained
from opod.fleet.state import Fleet


def fleet_with(node_id: str) -> Fleet:
    fleet = Fleet()
    fleet.register(nodeapi.RegisterRequest(id=node_id, address="a:8081", boot_id="b"), "t", nodeapi.Capabilities())
    fleet.heartbeat(nodeapi.Heartbeat(id=node_id, boot_id="b", loaded_models=["m"], slots=4))
    return fleet


def test_the_takeover_waits_for_a_long_request_on_the_old_weights_to_finish() -> None:
    fleet = fleet_with("a")
    node = fleet.get("a")
    assert node is not None
    long_one, other = fleet.lease(node, "m"), fleet.lease(node, "other-model")
    said: list[str] = []

    async def scenario() -> tuple[int, float]:
        asyncio.get_running_loop().call_later(0.6, long_one.release)
        began = time.monotonic()
        left = await drained(fleet, "m", 0.05, said.append)
        return left, time.monotonic() - began

    left, took = asyncio.run(scenario())
    assert left == 0 and 0.6 <= took < 2.0, (left, took)
    assert said == ["1 requests sent to m before the share moved are finishing"]
    other.release()


def test_the_wait_has_an_end_and_says_what_it_left_running() -> None:
    fleet = fleet_with("a")
    node = fleet.get("a")
    assert node is not None
    stuck = fleet.lease(node, "m")
    began = time.monotonic()
    assert asyncio.run(drained(fleet, "m", 0.0, lambda _: None, most=0.5)) == 1
    assert time.monotonic() - began < 1.5
    stuck.release()
    assert asyncio.run(drained(fleet, "m", 0.0, lambda _: None, most=0.5)) == 0
