"""Fair sharing between teams inside a class, under contention, as the teams would measure it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

from opod.contract.adminapi import PolicyAdmission
from opod.gateway.admission import Admission
from opod.gateway.fairqueue import FairQueue, Ticket

MODEL = "m"


async def run_load(
    adm: Admission, clients: dict[str, tuple[int, float, str]], total: int
) -> tuple[Counter, dict[str, float]]:
    """Closed-loop clients per flow name: (how many, hold seconds, team); stops after ``total`` admissions."""
    admitted: Counter = Counter()
    slot_time: dict[str, float] = defaultdict(float)
    done = asyncio.Event()

    async def client(name: str, hold: float, team: str, key_id: str) -> None:
        while not done.is_set():
            async with await adm.admit(MODEL, "standard", team=team, key_id=key_id):
                started = time.monotonic()
                admitted[name] += 1
                if sum(admitted.values()) >= total:
                    done.set()
                await asyncio.sleep(hold)
                slot_time[name] += time.monotonic() - started

    tasks = [
        # A team's clients use keys of their own; a name with no team is one key shared by its clients.
        asyncio.create_task(client(name, hold, team, f"{name}-{i}" if team else name))
        for name, (count, hold, team) in clients.items()
        for i in range(count)
    ]
    await asyncio.gather(*tasks)
    assert adm.stats()[MODEL].in_use == 0
    return admitted, slot_time


async def test_two_teams_with_unequal_offered_loads_get_equal_shares_within_ten_percent():
    # The acceptance criterion: team a offers four times team b's load (12 vs 3 clients always
    # waiting on 4 slots); over 3000 admissions each team gets half the slots, within 10 %.
    adm = Admission(lambda m: 4, PolicyAdmission(hold_ms=10_000, max_held=1000))
    admitted, _ = await run_load(adm, {"a": (12, 0.0005, "a"), "b": (3, 0.0005, "b")}, total=3000)
    a, b = admitted["a"], admitted["b"]
    assert abs(a - b) <= 0.10 * max(a, b), f"team a got {a}, team b got {b} admissions"


async def test_teams_share_slot_time_so_long_requests_do_not_crowd_out_short_ones():
    # Team a's requests hold a slot four times longer; sharing counts would give it 80 % of the
    # slot time. Fair sharing is in slot-time: each team holds about half of it.
    adm = Admission(lambda m: 4, PolicyAdmission(hold_ms=10_000, max_held=1000))
    admitted, slot_time = await run_load(adm, {"a": (8, 0.004, "a"), "b": (8, 0.001, "b")}, total=1500)
    a, b = slot_time["a"], slot_time["b"]
    assert abs(a - b) <= 0.15 * max(a, b), f"slot time a {a:.2f}s, b {b:.2f}s ({admitted})"
    assert admitted["b"] > 2 * admitted["a"]


async def test_keys_without_a_team_are_flows_of_their_own_and_a_team_is_one_flow():
    # Team t sends with eight keys; two lone keys have no team. Three flows, a third each,
    # where sharing by key would give t eight tenths. Shares are of slot time, what the queue
    # evens out: on a loaded machine one 0.5 ms hold can last several, so counts alone drift.
    adm = Admission(lambda m: 2, PolicyAdmission(hold_ms=10_000, max_held=1000))
    clients = {"t": (8, 0.0005, "t"), "k1": (3, 0.0005, ""), "k2": (3, 0.0005, "")}
    admitted, slot_time = await run_load(adm, clients, total=1500)
    held = sum(slot_time.values())
    for name in ("t", "k1", "k2"):
        assert abs(slot_time[name] / held - 1 / 3) < 0.05, (slot_time, admitted)
        assert admitted[name] / sum(admitted.values()) < 0.5, admitted  # never t's eight tenths


def test_a_flow_that_was_idle_banks_no_credit():
    queue = FairQueue()
    for _ in range(50):  # flow a alone: granted and settled 50 times
        queue.push("a", Ticket())
        ticket = queue.pop(1.0)
        queue.settle(ticket, 1.0)
    queue.push("a", Ticket())  # a keeps a waiter, so it is remembered
    for _ in range(4):
        queue.push("b", Ticket())
    order = [queue.pop(1.0).flow.key for _ in range(5)]
    assert order.count("a") == 1 and order.count("b") == 4
    assert order[:2] in (["a", "b"], ["b", "a"])  # b arrives level with a, not 50 turns behind
