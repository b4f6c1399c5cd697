"""The fleet owns its counters: leases count a worker's requests in flight, and its listeners hear when slots change."""

from __future__ import annotations

from opod.contract import nodeapi
from opod.fleet.router import Router, RouteRequest
from opod.fleet.state import Fleet

MODEL = "m"


def join(fleet: Fleet, node_id: str, slots: int = 4) -> None:
    fleet.register(
        nodeapi.RegisterRequest(id=node_id, address=f"{node_id}:8081", boot_id="b"), "t", nodeapi.Capabilities()
    )
    fleet.heartbeat(nodeapi.Heartbeat(id=node_id, boot_id="b", loaded_models=[MODEL], slots=slots))


def test_a_lease_counts_a_request_on_its_worker_until_released_once():
    fleet = Fleet()
    join(fleet, "a")
    join(fleet, "b")
    node = fleet.get("a")
    assert node is not None
    first, second = fleet.lease(node, MODEL), fleet.lease(node, MODEL)
    assert node.in_flight == 2
    decision = Router(fleet).pick(RouteRequest(MODEL))
    assert decision is not None and decision.node.id == "b"  # the router sees what is leased
    first.release()
    first.release()  # idempotent: a request gives its worker back once
    assert node.in_flight == 1
    second.release()
    assert node.in_flight == 0


def test_the_fleet_counts_each_models_requests_in_flight_over_its_workers():
    fleet = Fleet()
    join(fleet, "a")
    join(fleet, "b")
    a, b = fleet.get("a"), fleet.get("b")
    assert a is not None and b is not None
    held = [fleet.lease(a, MODEL), fleet.lease(b, MODEL), fleet.lease(b, "other")]
    assert (fleet.in_flight(MODEL), fleet.in_flight("other"), fleet.in_flight("none")) == (2, 1, 0)
    held[1].release()
    held[1].release()
    assert fleet.in_flight(MODEL) == 1 and b.in_flight == 1
    held[0].release()
    assert fleet.in_flight(MODEL) == 0 and fleet.in_flight("other") == 1


def test_listeners_hear_of_joins_drains_slots_and_leaving_but_not_of_a_heartbeat_that_changes_nothing():
    fleet = Fleet()
    heard: list[int] = []
    fleet.on_capacity_change(lambda: heard.append(1))
    join(fleet, "a")
    assert heard, "a worker joining changes the slots"
    heard.clear()
    fleet.heartbeat(nodeapi.Heartbeat(id="a", boot_id="b", loaded_models=[MODEL], slots=4))
    assert heard == []
    fleet.heartbeat(nodeapi.Heartbeat(id="a", boot_id="b", loaded_models=[MODEL], slots=8))
    assert len(heard) == 1
    fleet.heartbeat(nodeapi.Heartbeat(id="a", boot_id="b", loaded_models=[MODEL, "other"], slots=8))
    assert len(heard) == 2
    fleet.set_drained("a", True)
    fleet.set_drained("a", False)
    assert len(heard) == 4
    fleet.remove("a")
    assert len(heard) == 5
