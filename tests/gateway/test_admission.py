"""Admission as a caller of the gateway sees it: permits, waits, sheds, classes, the fleet's slots."""

from __future__ import annotations

import asyncio

import pytest

from opod.contract import nodeapi
from opod.contract.adminapi import AdmissionClass, PolicyAdmission, PolicyAdmissionClass
from opod.fleet.state import Fleet
from opod.gateway import admission as admission_module
from opod.gateway.admission import Admission, Shed, ShedReason, fleet_capacity, resolve_class
from opod.http.errors import BadRequest, error_response
from tests.gateway.manual_clock import ManualClock

MODEL = "m"


def policy(hold_ms: int = 0, max_held: int = 0, **classes: dict) -> PolicyAdmission:
    rules = [PolicyAdmissionClass(name=name, **rule) for name, rule in classes.items()]
    return PolicyAdmission(hold_ms=hold_ms, max_held=max_held, classes=rules or None)


def fixed(size: int) -> dict[str, int]:
    return {MODEL: size}


def admission_of(
    sizes: dict[str, int], pol: PolicyAdmission | None = None, clock: ManualClock | None = None
) -> Admission:
    return Admission(lambda model: sizes.get(model, 0), pol, clock=clock or ManualClock())


def join(fleet: Fleet, node_id: str, models: list[str], slots: int) -> None:
    fleet.register(
        nodeapi.RegisterRequest(id=node_id, address=f"{node_id}:8081", boot_id="b"), "tok", nodeapi.Capabilities()
    )
    fleet.heartbeat(nodeapi.Heartbeat(id=node_id, loaded_models=models, boot_id="b", slots=slots))


async def settle() -> None:
    """Let every ready callback and task step run."""
    for _ in range(5):
        await asyncio.sleep(0)


# --- the uncontended path -------------------------------------------------------


async def test_a_free_slot_admits_at_once_and_comes_back_once():
    fleet = Fleet()  # the real capacity source, as the gateway will use it
    join(fleet, "n1", [MODEL], slots=4)
    join(fleet, "n2", [MODEL], slots=4)
    adm = Admission(fleet_capacity(fleet))
    permit = await adm.admit(MODEL)
    assert not permit.released and adm.stats()[MODEL].in_use == 1
    permit.release()
    permit.release()  # idempotent: the slot comes back once
    assert adm.stats()[MODEL].in_use == 0

    permits = [adm.admit_now(MODEL, "standard") for _ in range(8)]  # every slot of both workers, none waiting
    assert all(p is not None for p in permits) and adm.admit_now(MODEL) is None
    for p in permits:
        assert p is not None
        p.release()
    stats = adm.stats()[MODEL]
    assert stats.in_use == 0 and stats.admitted_by_class["standard"] == 9
    assert sum(stats.waiting_by_class.values()) == sum(stats.shed_by_class.values()) == 0


async def test_a_permit_is_an_async_context_manager():
    adm = admission_of(fixed(1))
    async with await adm.admit(MODEL) as permit:
        assert adm.stats()[MODEL].in_use == 1
    assert permit.released and adm.stats()[MODEL].in_use == 0


async def test_a_model_no_live_worker_holds_is_left_to_the_relay():
    # Size 0: admission stands aside; the relay's "no worker is serving" is the true answer.
    adm = admission_of({})
    permits = [await adm.admit(MODEL, "sheddable") for _ in range(3)]
    assert adm.stats()[MODEL].in_use == 3
    for p in permits:
        p.release()


# --- shedding ---------------------------------------------------------------------


async def test_admit_now_grants_a_free_slot_and_leaves_a_full_pool_to_admit():
    adm = admission_of(fixed(1), policy(5000))
    held = adm.admit_now(MODEL)
    assert held is not None and adm.stats()[MODEL].in_use == 1
    assert adm.admit_now(MODEL) is None  # full: nothing queued, nothing shed
    stats = adm.stats()[MODEL]
    assert (sum(stats.waiting_by_class.values()), sum(stats.shed_by_class.values())) == (0, 0)
    waiter = asyncio.create_task(adm.admit(MODEL))
    await settle()
    assert sum(adm.stats()[MODEL].waiting_by_class.values()) == 1
    held.release()
    (await waiter).release()
    with pytest.raises(ValueError, match="not one of"):
        adm.admit_now(MODEL, "urgent")


async def test_an_empty_policy_sheds_at_once_when_full_with_an_honest_503():
    adm = admission_of(fixed(1))
    held = await adm.admit(MODEL)
    with pytest.raises(Shed) as info:
        await adm.admit(MODEL, "standard")
    err = info.value
    assert err.reason is ShedReason.NO_HOLD
    response = error_response(err, "req-1")
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert "'m'" in err.message and "standard" in err.message and "1/1 slots" in err.message
    assert adm.stats()[MODEL].shed_by_class == {"critical": 0, "standard": 1, "sheddable": 0}
    held.release()


async def test_critical_goes_ahead_of_the_queue_while_sheddable_is_shed_after_its_hold():
    clock = ManualClock()
    adm = admission_of(fixed(2), policy(5000, critical={"hold_ms": 5000}, sheddable={"hold_ms": 30}), clock)
    held = [await adm.admit(MODEL, "standard") for _ in range(2)]
    standard = [asyncio.create_task(adm.admit(MODEL, "standard", key_id=f"s{i}")) for i in range(3)]
    sheddable = [asyncio.create_task(adm.admit(MODEL, "sheddable", key_id=f"x{i}")) for i in range(2)]
    await settle()
    critical = asyncio.create_task(adm.admit(MODEL, "critical"))
    await settle()
    assert adm.stats()[MODEL].waiting_by_class == {"critical": 1, "standard": 3, "sheddable": 2}

    held.pop().release()
    await settle()
    assert critical.done() and not any(t.done() for t in standard)  # the next slot, ahead of the queue

    clock.advance(0.029)
    await settle()
    assert not any(t.done() for t in sheddable)
    clock.advance(0.002)  # past the sheddable hold
    await settle()
    for task in sheddable:
        err = task.exception()
        assert isinstance(err, Shed) and err.reason is ShedReason.HOLD_EXPIRED
        assert "sheddable" in err.message and "'m'" in err.message and "waited 30 ms" in err.message
        response = error_response(err, "r")
        assert response.status_code == 503 and int(response.headers["Retry-After"]) >= 1
    assert not any(t.done() for t in standard)  # their hold is 5 s: still waiting

    critical.result().release()
    held.pop().release()
    await settle()
    assert sum(t.done() for t in standard) == 2
    for task in standard:
        (await task).release()
    stats = adm.stats()[MODEL]
    assert stats.in_use == 0 and stats.shed_by_reason == {"hold_expired": 2}
    assert stats.admitted_by_class == {"critical": 1, "standard": 5, "sheddable": 0}


async def test_max_held_sheds_beyond_the_cap_and_a_higher_class_takes_a_lower_ones_place():
    adm = admission_of(fixed(1), policy(10_000, max_held=3))
    held = await adm.admit(MODEL)
    waiters = [asyncio.create_task(adm.admit(MODEL, "sheddable", key_id=f"k{i}")) for i in range(3)]
    await settle()
    assert adm.stats()[MODEL].waiting_by_class["sheddable"] == 3

    with pytest.raises(Shed) as info:
        await adm.admit(MODEL, "sheddable")
    assert info.value.reason is ShedReason.QUEUE_FULL and "maxHeld 3" in info.value.message

    critical = asyncio.create_task(adm.admit(MODEL, "critical"))
    await settle()
    displaced = [t for t in waiters if t.done()]
    assert len(displaced) == 1 and displaced[0].exception().reason is ShedReason.DISPLACED

    held.release()
    (await critical).release()  # the critical request went first
    for task in waiters:
        if not task.done() or task.exception() is None:
            (await task).release()
    stats = adm.stats()[MODEL]
    assert stats.in_use == 0 and sum(stats.waiting_by_class.values()) == 0
    assert stats.shed_by_reason == {"queue_full": 1, "displaced": 1}


async def test_retry_after_follows_the_queue_and_the_recent_pace():
    clock = ManualClock()
    adm = admission_of(fixed(1), policy(10_000, max_held=29), clock)
    async with await adm.admit(MODEL):
        clock.advance(0.08)  # the pool now knows a slot is held 0.08 s
    held = await adm.admit(MODEL)
    waiters = [asyncio.create_task(adm.admit(MODEL)) for _ in range(29)]
    await settle()
    with pytest.raises(Shed) as info:
        await adm.admit(MODEL)
    # 29 ahead + this one, one slot, 0.08 s each: 2.4 s, said as 3.
    assert info.value.retry_after == 3, info.value.message
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    held.release()
    assert adm.stats()[MODEL].in_use == 0


# --- classes --------------------------------------------------------------------------


def test_the_header_lowers_a_class_and_never_raises_it():
    assert resolve_class("") == "standard"
    assert resolve_class("", "") == "standard"
    assert resolve_class("critical", "sheddable") == "sheddable"
    assert resolve_class("critical", " Standard ") == "standard"
    assert resolve_class("standard", "critical") == "standard"
    assert resolve_class("sheddable", "critical") == "sheddable"
    assert resolve_class("critical") is AdmissionClass.CRITICAL
    with pytest.raises(BadRequest) as info:
        resolve_class("standard", "urgent")
    assert info.value.status == 400 and "X-Opod-Class" in info.value.message and "urgent" in info.value.message
    with pytest.raises(ValueError, match="'vip'"):
        resolve_class("vip")


async def test_waiting_requests_get_slots_in_class_order_then_arrival_order():
    adm = admission_of(fixed(1), policy(5000))
    held = await adm.admit(MODEL)
    order: list[str] = []

    async def request(name: str, cls: str) -> None:
        async with await adm.admit(MODEL, cls, team="one"):
            order.append(name)

    tasks = []
    for name, cls in [
        ("s1", "sheddable"),
        ("t1", "standard"),
        ("c1", "critical"),
        ("t2", "standard"),
        ("c2", "critical"),
    ]:
        tasks.append(asyncio.create_task(request(name, cls)))
        await settle()
    held.release()
    await asyncio.gather(*tasks)
    assert order == ["c1", "c2", "t1", "t2", "s1"]


async def test_max_share_caps_a_class_and_leaves_the_rest_to_others():
    adm = admission_of(fixed(8), policy(10_000, sheddable={"hold_ms": 10_000, "max_share": 0.25}))
    sheddable = [asyncio.create_task(adm.admit(MODEL, "sheddable", key_id=f"k{i}")) for i in range(5)]
    await settle()
    assert sum(t.done() for t in sheddable) == 2  # floor(0.25 × 8)
    assert adm.stats()[MODEL].waiting_by_class["sheddable"] == 3
    standard = [await adm.admit(MODEL, "standard") for _ in range(6)]  # the other six slots, at once
    assert adm.stats()[MODEL].in_use == 8
    for p in standard:
        p.release()
    await settle()
    assert sum(t.done() for t in sheddable) == 2  # free slots, yet the class stays at its cap
    first = [t.result() for t in sheddable if t.done()]
    first[0].release()
    await settle()
    assert sum(t.done() for t in sheddable) == 3
    for task in sheddable:
        task.cancel()
    await asyncio.gather(*sheddable, return_exceptions=True)
    for task in sheddable:
        if task.done() and not task.cancelled():
            task.result().release()
    assert adm.stats()[MODEL].in_use == 0


async def test_a_small_pool_still_gives_a_capped_class_one_slot():
    adm = admission_of(fixed(2), policy(0, sheddable={"max_share": 0.25}))
    permit = await adm.admit(MODEL, "sheddable")  # floor(0.5) = 0, but at least 1
    with pytest.raises(Shed):
        await adm.admit(MODEL, "sheddable")
    permit.release()


# --- the pool follows the fleet ----------------------------------------------------


def test_pool_size_is_the_slots_of_the_live_workers_holding_the_model():
    fleet = Fleet()
    capacity = fleet_capacity(fleet, default_slots=4, ttl=60)
    assert capacity(MODEL) == 0
    join(fleet, "n1", [MODEL], slots=2)
    assert capacity(MODEL) == 2
    join(fleet, "n2", [MODEL, "other"], slots=0)  # says nothing: counts the default
    assert capacity(MODEL) == 6 and capacity("other") == 4
    fleet.set_drained("n1", True)
    assert capacity(MODEL) == 4
    # A heartbeat changing only the slot count is seen at once, cache or not.
    fleet.heartbeat(nodeapi.Heartbeat(id="n2", loaded_models=[MODEL, "other"], boot_id="b", slots=8))
    assert capacity(MODEL) == 8
    fleet.remove("n2")
    assert capacity(MODEL) == 0


async def test_a_waiter_takes_the_slot_a_new_worker_brings_at_once():
    clock = ManualClock()  # never advanced: no recheck timer runs
    fleet = Fleet()
    join(fleet, "n1", [MODEL], slots=1)
    adm = Admission(fleet_capacity(fleet, ttl=60), policy(5000), clock=clock)
    held = await adm.admit(MODEL)
    waiter = asyncio.create_task(adm.admit(MODEL))
    await settle()
    assert not waiter.done()
    join(fleet, "n2", [MODEL], slots=1)
    await settle()
    assert waiter.done()
    assert adm.stats()[MODEL].size == 2 and adm.stats()[MODEL].in_use == 2
    waiter.result().release()
    held.release()


async def test_waiters_follow_the_fleet_as_workers_drain_come_back_and_report_more_slots():
    clock = ManualClock()
    fleet = Fleet()
    join(fleet, "n1", [MODEL], slots=1)
    join(fleet, "n2", [MODEL], slots=1)
    adm = Admission(fleet_capacity(fleet, ttl=60), policy(5000), clock=clock)
    fleet.set_drained("n2", True)
    held = await adm.admit(MODEL)
    waiters = [asyncio.create_task(adm.admit(MODEL, key_id=f"k{i}")) for i in range(3)]
    await settle()
    assert sum(t.done() for t in waiters) == 0  # the drained worker's slot is not offered
    fleet.set_drained("n2", False)
    await settle()
    assert sum(t.done() for t in waiters) == 1
    fleet.heartbeat(nodeapi.Heartbeat(id="n1", loaded_models=[MODEL], boot_id="b", slots=3))
    await settle()
    assert sum(t.done() for t in waiters) == 3
    assert adm.stats()[MODEL].in_use == 4
    for task in waiters:
        task.result().release()
    held.release()


async def test_slots_no_event_announces_are_found_by_the_recheck():
    clock = ManualClock()
    sizes = fixed(1)
    adm = admission_of(sizes, policy(5000), clock)
    held = await adm.admit(MODEL)
    waiter = asyncio.create_task(adm.admit(MODEL))
    await settle()
    sizes[MODEL] = 2  # say, a worker's cooldown ran out: nothing tells the pool
    clock.advance(admission_module.RECHECK_S * 0.9)
    await settle()
    assert not waiter.done()
    clock.advance(admission_module.RECHECK_S * 0.1)
    await settle()
    assert waiter.done()
    waiter.result().release()
    held.release()


# --- cancellation and reconfiguration ---------------------------------------------


async def test_a_cancelled_waiter_leaves_no_slot_behind():
    adm = admission_of(fixed(1), policy(5000))
    held = await adm.admit(MODEL)
    waiter = asyncio.create_task(adm.admit(MODEL, team="a"))
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.stats()[MODEL].waiting_by_class["standard"] == 0
    held.release()
    assert adm.stats()[MODEL].in_use == 0
    (await adm.admit(MODEL)).release()  # the slot is free for the next one at once

    # The slot reaches the waiter and its client goes away in the same moment.
    held = await adm.admit(MODEL)
    waiter = asyncio.create_task(adm.admit(MODEL, team="a"))
    await settle()
    held.release()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert adm.stats()[MODEL].in_use == 0

    # Cancelled, then a slot frees before the cancelled task runs again.
    held = await adm.admit(MODEL)
    waiter = asyncio.create_task(adm.admit(MODEL, team="a"))
    other = asyncio.create_task(adm.admit(MODEL, team="b"))
    await settle()
    waiter.cancel()
    held.release()
    await asyncio.gather(waiter, return_exceptions=True)
    (await other).release()
    assert adm.stats()[MODEL].in_use == 0


async def test_configure_mid_flight_keeps_permits_and_applies_at_once():
    adm = admission_of(fixed(4), policy(5000, sheddable={"hold_ms": 5000, "max_share": 0.25}))
    standard = [await adm.admit(MODEL) for _ in range(2)]
    sheddable = [asyncio.create_task(adm.admit(MODEL, "sheddable", key_id=f"k{i}")) for i in range(3)]
    await settle()
    assert sum(t.done() for t in sheddable) == 1

    adm.configure(policy(5000, sheddable={"hold_ms": 5000, "max_share": 0.5}))
    await settle()
    assert sum(t.done() for t in sheddable) == 2  # the raised share admitted a waiter

    with pytest.raises(ValueError, match="twice"):
        adm.configure(
            PolicyAdmission(classes=[PolicyAdmissionClass(name="critical"), PolicyAdmissionClass(name="critical")])
        )
    assert adm.config.max_share[2] == 0.5  # a bad policy changed nothing

    adm.configure(policy(0))  # now nobody waits: new arrivals at a full pool are shed
    with pytest.raises(Shed):
        await adm.admit(MODEL, "critical")
    for p in standard:
        p.release()  # permits from before the swap still give their slot back
    await settle()
    assert all(t.done() for t in sheddable)
    for task in sheddable:
        task.result().release()
    assert adm.stats()[MODEL].in_use == 0


def test_stats_name_every_class():
    adm = admission_of(fixed(3))
    assert adm.stats() == {}
    adm.capacity_changed()
    adm.capacity_changed(MODEL)
    stats = asyncio.run(_one_admission(adm))
    assert stats.size == 3 and stats.in_use == 1
    assert stats.in_use_by_class == {"critical": 1, "standard": 0, "sheddable": 0}
    assert set(stats.waiting_by_class) == set(stats.shed_by_class) == {"critical", "standard", "sheddable"}


async def _one_admission(adm: Admission):
    permit = await adm.admit(MODEL, resolve_class("critical"))
    assert permit.admission_class is AdmissionClass.CRITICAL
    return adm.stats()[MODEL]


# --- stopping -------------------------------------------------------------------


async def test_a_stopping_node_refuses_new_and_waiting_requests_and_lets_held_ones_finish():
    adm = admission_of(fixed(1), policy(hold_ms=30_000))
    held = await adm.admit(MODEL)
    waiting = asyncio.ensure_future(adm.admit(MODEL))
    await settle()
    assert not waiting.done() and not adm.stopping

    assert adm.close(retry_after=5) == 1  # one request in flight
    await settle()
    assert adm.stopping
    with pytest.raises(admission_module.Stopping) as queued:
        await waiting
    with pytest.raises(admission_module.Stopping) as new:
        await adm.admit(MODEL)
    for refusal in (queued.value, new.value):
        response = error_response(refusal, "r1")
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        assert "not taking new requests" in refusal.message and "stopping" in refusal.message
    assert adm.stats()[MODEL].waiting_by_class["standard"] == 0
    assert not held.released and adm.in_flight == 1  # the answer in flight keeps its slot


async def test_settled_returns_once_the_last_request_in_flight_is_answered():
    adm = admission_of(fixed(4))
    first, second = await adm.admit(MODEL), await adm.admit(MODEL)
    adm.close(retry_after=5)
    settled = asyncio.ensure_future(adm.settled(30))
    await settle()
    first.release()
    await settle()
    assert not settled.done()
    second.release()
    assert await asyncio.wait_for(settled, 1) is True
    assert adm.in_flight == 0


async def test_settled_gives_up_after_the_grace_with_requests_still_in_flight():
    adm = admission_of(fixed(1))
    held = await adm.admit(MODEL)
    adm.close(retry_after=5)
    assert await adm.settled(0.05) is False
    held.release()
    assert await adm.settled(0.05) is True
