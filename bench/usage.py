"""The usage ledger: rows per second made durable in the store, and the time from ``end()`` to the
row being offered on the usage stream.

For each store (SQLite; PostgreSQL too when ``OPOD_TEST_POSTGRES_URL`` is set) and each offered
rate, one event loop does what a leader does: requests call ``begin``/``end`` at that rate (paced
every millisecond; ``max`` = back to back), the writer (``Ledger.run``) commits in the background,
and a follower pages the stream as a manager would (``usage_page``, 1000 rows, polling every
millisecond when it has caught up). ``prompt_tokens`` carries each request's number, so the
follower knows when each row's ``end()`` returned.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from opod.ledger import Ledger
from opod.store import Store

console = Console()
RESULTS = Path(__file__).parent / "results"
POSTGRES_ENV = "OPOD_TEST_POSTGRES_URL"
GOAL_ROWS_S = 5000


@dataclass
class Run:
    backend: str
    rate: str  # offered rate, or "max"
    rows: int = 0
    durable_s: float = 0.0  # first end() → last row committed
    max_backlog: int = 0
    offered_ms: list[float] = field(default_factory=list)
    call_us: list[float] = field(default_factory=list)  # begin + end, per request

    @property
    def rows_s(self) -> float:
        return self.rows / self.durable_s if self.durable_s else 0.0

    def pct(self, values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


@contextmanager
def _database(backend: str, scratch: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{scratch / 'opod.db'}"
        return
    from sqlalchemy import create_engine, make_url
    from sqlalchemy.pool import NullPool

    base = make_url(os.environ[POSTGRES_ENV]).set(drivername="postgresql+psycopg")
    schema = f"opod_bench_{secrets.token_hex(4)}"
    admin = create_engine(base, poolclass=NullPool)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


async def _measure(ledger: Ledger, run: Run, rate: float | None, seconds: float, tick: Callable[[float], None]) -> None:
    ended_at: list[float] = []
    stop, done = asyncio.Event(), asyncio.Event()
    writer = asyncio.create_task(ledger.run(stop))
    seen_last = 0.0

    async def follow() -> None:
        nonlocal seen_last
        after = 0
        while True:
            page = await ledger.usage_page(after, 1000)
            now = time.perf_counter()
            for event in page.events:
                run.offered_ms.append((now - ended_at[event.data.prompt_tokens]) * 1000)
            if page.events:
                seen_last, after = now, page.next
            elif done.is_set() and len(run.offered_ms) == len(ended_at):
                return
            if not page.more:
                await asyncio.sleep(0.001)

    def one() -> None:
        n = len(ended_at)
        started = time.perf_counter()
        ticket = ledger.begin(request_id=f"bench-{n}", api_key_id="k_bench", user_id="u", model="m", protocol="openai")
        ended_at.append(0.0)
        ledger.end(ticket, outcome="ok", prompt_tokens=n, completion_tokens=128, latency_ms=900, ttft_ms=40, node_id="node-a",
                   route={"worker": "node-a", "reason": "prefix"})
        now = time.perf_counter()
        ended_at[n] = now
        run.call_us.append((now - started) * 1e6)

    follower = asyncio.create_task(follow())
    first = time.perf_counter()
    while (elapsed := time.perf_counter() - first) < seconds:
        due = 500 if rate is None else int(rate * elapsed) - len(ended_at)
        for _ in range(max(due, 0)):
            one()
        run.max_backlog = max(run.max_backlog, ledger.writer.backlog)
        tick(min(elapsed, seconds))
        await (asyncio.sleep(0) if rate is None else asyncio.sleep(0.001))
    await ledger.flush()
    run.durable_s = time.perf_counter() - first
    done.set()
    await follower
    run.rows = len(ended_at)
    stop.set()
    await writer


def run_backend(backend: str, rates: list[str], seconds: float, progress: Progress) -> list[Run]:
    runs = []
    with tempfile.TemporaryDirectory() as scratch, _database(backend, Path(scratch)) as url:
        store = Store.open(url)
        try:
            for i, rate in enumerate(rates):
                run = Run(backend, rate)
                task = progress.add_task(f"{backend}: {rate} rows/s offered", total=seconds)
                # A fresh home and fresh ids for each rate: pages start at 0 again.
                store.delete_usage_before(_far_future(), limit=10**9)
                ledger = Ledger.open(store, Path(scratch) / f"home-{i}", boot=i + 1, keep=timedelta(days=30))
                try:
                    asyncio.run(_measure(ledger, run, None if rate == "max" else float(rate), seconds,
                                         lambda done, t=task: progress.update(t, completed=done)))
                finally:
                    ledger.close()
                runs.append(run)
        finally:
            store.close()
    return runs


def _far_future():
    from datetime import UTC, datetime

    return datetime(9999, 1, 1, tzinfo=UTC)


def _f(value: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def _rows(runs: list[Run]) -> Iterator[list[str]]:
    for r in runs:
        yield [r.backend, r.rate, f"{r.rows:,}", _f(r.rows_s, 0), f"{r.max_backlog:,}", _f(r.pct(r.offered_ms, 50)),
               _f(r.pct(r.offered_ms, 99)), _f(statistics.median(r.call_us) if r.call_us else float("nan"))]


HEADERS = ["store", "offered rows/s", "rows", "durable rows/s", "max backlog", "end→offered p50 ms", "end→offered p99 ms", "begin+end µs (median)"]


def report(runs: list[Run], seconds: float, out: Path) -> None:
    lines = [
        (f"# Usage ledger: rows made durable, end() → offered on the stream ({time.strftime('%Y-%m-%d %H:%M')}, "
         f"{platform.machine()}, {os.cpu_count()} CPUs)"),
        "",
        (f"{seconds:g} s per rate. One event loop holds the requests, the writer and a follower paging the stream; the "
         "database is local. Durable rows/s = rows ÷ (first end() → last row committed). Goal: ≥ "
         f"{GOAL_ROWS_S:,} rows/s on SQLite."),
        "",
        "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(runs)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "usage.md").write_text("\n".join(lines) + "\n")
    _plot(runs, out / "usage.png")


def _plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for backend, color in zip(dict.fromkeys(r.backend for r in runs), ("#1f77b4", "#2ca02c"), strict=False):
        mine = [r for r in runs if r.backend == backend]
        labels = [r.rate for r in mine]
        left.plot(labels, [r.rows_s for r in mine], marker="o", color=color, label=backend)
        right.plot(labels, [r.pct(r.offered_ms, 50) for r in mine], marker="o", color=color, label=f"{backend} p50")
        right.plot(labels, [r.pct(r.offered_ms, 99) for r in mine], marker="x", color=color, linestyle="--", label=f"{backend} p99")
    left.axhline(GOAL_ROWS_S, color="#c33", linestyle=":", label="goal (SQLite)")
    left.set_xlabel("offered rows/s")
    left.set_ylabel("durable rows/s")
    left.set_title("rows made durable")
    right.set_xlabel("offered rows/s")
    right.set_ylabel("ms")
    right.set_yscale("log")
    right.set_title("end() → offered on the stream")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def command(
    seconds: float = typer.Option(5.0, help="Seconds of end() calls per rate."),
    rate: list[str] = typer.Option(["1000", "5000", "10000", "20000", "max"], help="Offered rows/s (repeat the option); max = back to back."),
    postgres: bool = typer.Option(True, help=f"Also measure PostgreSQL when {POSTGRES_ENV} is set."),
    results: Path = typer.Option(RESULTS, help="Where usage.md and usage.png go."),
) -> None:
    """Usage rows per second made durable (SQLite, PostgreSQL) and end() → offered latency."""
    for value in rate:
        if value != "max" and not (value.isdigit() and int(value) > 0):
            raise typer.BadParameter(f"{value!r} is not a rate; give rows per second (e.g. 5000) or max", param_hint="--rate")
    backends = ["sqlite"] + (["postgresql"] if postgres and os.environ.get(POSTGRES_ENV, "").strip() else [])
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s"), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        runs = [run for backend in backends for run in run_backend(backend, rate, seconds, progress)]
    table = Table(title="opod usage ledger", header_style="bold")
    for header in HEADERS:
        table.add_column(header)
    for row in _rows(runs):
        table.add_row(*row)
    console.print(table)
    report(runs, seconds, results)
    if len(backends) == 1:
        console.print(f"[dim]PostgreSQL not measured: set {POSTGRES_ENV}=postgresql+psycopg://USER:PASSWORD@HOST/DB[/]")
    console.print(f"[dim]written: {results / 'usage.md'} and {results / 'usage.png'}[/]")
