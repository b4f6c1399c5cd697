"""What admission costs on the request path, and how it shares a saturated pool.

1. Uncontended: admit + release with a free slot, capacity read from a real
   in-memory fleet (cached) and uncached, on asyncio's loop and on uvloop.
2. Contended: closed-loop clients in several teams on a small pool, each
   holding its slot for one loop turn: handovers per second and the cost of one.
3. Sharing: two teams with unequal offered loads on one class; their shares of
   admissions and of slot-time.

No network and no engine: this is the scheduler alone.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections import Counter
from pathlib import Path

import typer
import uvloop
from rich.console import Console
from rich.table import Table

from bench.tables import md_table
from opod.contract import nodeapi
from opod.contract.adminapi import PolicyAdmission
from opod.fleet.state import Fleet
from opod.gateway.admission import Admission, fleet_capacity

console = Console()
MODEL = "m"


def _fleet(workers: int, slots: int) -> Fleet:
    fleet = Fleet()
    for i in range(workers):
        node = f"n{i}"
        fleet.register(
            nodeapi.RegisterRequest(id=node, address=f"{node}:8081", boot_id="b"), "t", nodeapi.Capabilities()
        )
        fleet.heartbeat(nodeapi.Heartbeat(id=node, loaded_models=[MODEL], boot_id="b", slots=slots))
    return fleet


async def _uncontended(ttl: float, rounds: int) -> float:
    adm = Admission(fleet_capacity(_fleet(4, 8), ttl=ttl))
    start = time.perf_counter()
    for _ in range(rounds):
        (await adm.admit(MODEL, "standard", team="t", key_id="k")).release()
    return (time.perf_counter() - start) / rounds * 1e6


async def _contended(slots: int, teams: int, clients: int, total: int) -> tuple[float, Counter]:
    adm = Admission(lambda m: slots, PolicyAdmission(hold_ms=60_000, max_held=100_000))
    admitted: Counter = Counter()
    count = 0

    async def client(team: str) -> None:
        nonlocal count
        while count < total:
            async with await adm.admit(MODEL, "standard", team=team):
                count += 1
                admitted[team] += 1
                await asyncio.sleep(0)

    start = time.perf_counter()
    await asyncio.gather(*(client(f"team{i % teams}") for i in range(clients)))
    return (time.perf_counter() - start) / count * 1e6, admitted


async def _sharing(total: int) -> tuple[Counter, dict[str, float]]:
    adm = Admission(lambda m: 4, PolicyAdmission(hold_ms=60_000, max_held=1000))
    admitted: Counter = Counter()
    slot_time: dict[str, float] = {"a": 0.0, "b": 0.0}

    async def client(team: str, hold: float) -> None:
        while sum(admitted.values()) < total:
            async with await adm.admit(MODEL, "standard", team=team):
                started = time.monotonic()
                admitted[team] += 1
                await asyncio.sleep(hold)
                slot_time[team] += time.monotonic() - started

    await asyncio.gather(*(client("a", 0.001) for _ in range(12)), *(client("b", 0.001) for _ in range(3)))
    return admitted, slot_time


RESULTS = Path(__file__).parent / "results"
CONTENDED = ((1, 64), (8, 64), (64, 256))
"""(teams, clients) of each contended case, 8 slots."""
HEADERS = ["case", "loop", "µs per request"]
SHARE_HEADERS = ["team", "clients", "admissions", "share", "slot-time s"]


def command(
    rounds: int = typer.Option(200_000, help="Uncontended admissions per measurement."),
    contended: int = typer.Option(100_000, help="Admissions per contended case."),
    shared: int = typer.Option(4000, help="Admissions in the two teams' sharing run."),
    results: Path = typer.Option(RESULTS, help="Where admission.md goes."),
) -> None:
    """Admission's cost per request, uncontended and contended, and how two teams share a full pool."""
    rows: list[list[str]] = []
    for loop_name, runner in (("asyncio", asyncio.run), ("uvloop", uvloop.run)):
        for label, ttl in (("uncontended, capacity cached", 1.0), ("uncontended, capacity read each time", 0.0)):
            rows.append([label, loop_name, f"{runner(_uncontended(ttl, rounds)):.2f}"])
        for teams, clients in CONTENDED:
            cost, _ = runner(_contended(8, teams, clients, contended))
            rows.append([f"contended, {clients} clients in {teams} teams", loop_name, f"{cost:.2f}"])
    admitted, slot_time = uvloop.run(_sharing(shared))
    total = sum(admitted.values())
    shares = [
        [team, str(clients), str(admitted[team]), f"{admitted[team] / total:.1%}", f"{slot_time[team]:.2f}"]
        for team, clients in (("a", 12), ("b", 3))
    ]
    table = Table(
        title="admission: cost per request", caption="contended: 8 slots; a request's wait includes its loop turns"
    )
    for i, column in enumerate(HEADERS):
        table.add_column(column, justify="right" if i == 2 else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    share = Table(title="two teams, 12 and 3 clients, 4 slots, 1 ms holds")
    for column in SHARE_HEADERS:
        share.add_column(column, justify="right")
    for row in shares:
        share.add_row(*row)
    console.print(share)
    path = report(rows, shares, rounds, contended, shared, results)
    console.print(f"[dim]written: {path}[/]")


def report(rows: list[list[str]], shares: list[list[str]], rounds: int, contended: int, shared: int, out: Path) -> Path:
    lines = [
        f"# Admission: cost per request and sharing ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs)",
        "",
        f"`python -m bench admission --rounds {rounds} --contended {contended} --shared {shared}`. The scheduler alone: "
        "no network, no engine. Contended: 8 slots; a request's wait includes its loop turns.",
        "",
        *md_table(HEADERS, rows),
        "",
        "## Two teams, 12 and 3 clients, 4 slots, 1 ms holds",
        "",
        *md_table(SHARE_HEADERS, shares),
        "",
    ]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "admission.md"
    path.write_text("\n".join(lines))
    return path
