"""The usage ledger: rows per second made durable in the store, and the time from ``end()`` to the
row being offered on the usage stream.

For each store (SQLite; PostgreSQL too when ``OPOD_TEST_POSTGRES_URL`` is set) and each offered
rate, one event loop does what a leader does: requests call ``begin``/``end`` at that rate (paced
every millisecond; ``max`` = back to back), the writer (``Ledger.run``) commits in the background,
and a follower pages the stream as a manager would (``usage_page``, 1000 rows, polling every
millisecond when it has caught up). ``prompt_tokens`` carries each request's number, so the
follower knows when each row's ``end()`` returned.

``python -m bench.usage paths`` compares, side by side in turns, the journal's way of writing a line
against an mmap copy, and the store's way of committing a batch against SQLAlchemy Core and against
unchecked values (``bench/results/usage-write-paths.md``).
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
        ledger.end(
            ticket,
            outcome="ok",
            prompt_tokens=n,
            completion_tokens=128,
            latency_ms=900,
            ttft_ms=40,
            node_id="node-a",
            route={"worker": "node-a", "reason": "prefix"},
        )
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
                    asyncio.run(
                        _measure(
                            ledger,
                            run,
                            None if rate == "max" else float(rate),
                            seconds,
                            lambda done, t=task: progress.update(t, completed=done),
                        )
                    )
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
        yield [
            r.backend,
            r.rate,
            f"{r.rows:,}",
            _f(r.rows_s, 0),
            f"{r.max_backlog:,}",
            _f(r.pct(r.offered_ms, 50)),
            _f(r.pct(r.offered_ms, 99)),
            _f(statistics.median(r.call_us) if r.call_us else float("nan")),
        ]


HEADERS = [
    "store",
    "offered rows/s",
    "rows",
    "durable rows/s",
    "max backlog",
    "end→offered p50 ms",
    "end→offered p99 ms",
    "begin+end µs (median)",
]


def report(runs: list[Run], seconds: float, out: Path) -> None:
    lines = [
        (
            f"# Usage ledger: rows made durable, end() → offered on the stream ({time.strftime('%Y-%m-%d %H:%M')}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs)"
        ),
        "",
        (
            f"{seconds:g} s per rate. One event loop holds the requests, the writer and a follower paging the stream; the "
            "database is local. Durable rows/s = rows ÷ (first end() → last row committed). Goal: ≥ "
            f"{GOAL_ROWS_S:,} rows/s on SQLite."
        ),
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
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
        right.plot(
            labels,
            [r.pct(r.offered_ms, 99) for r in mine],
            marker="x",
            color=color,
            linestyle="--",
            label=f"{backend} p99",
        )
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
    rate: list[str] = typer.Option(
        ["1000", "5000", "10000", "20000", "max"], help="Offered rows/s (repeat the option); max = back to back."
    ),
    postgres: bool = typer.Option(True, help=f"Also measure PostgreSQL when {POSTGRES_ENV} is set."),
    results: Path = typer.Option(RESULTS, help="Where usage.md and usage.png go."),
) -> None:
    """Usage rows per second made durable (SQLite, PostgreSQL) and end() → offered latency."""
    for value in rate:
        if value != "max" and not (value.isdigit() and int(value) > 0):
            raise typer.BadParameter(
                f"{value!r} is not a rate; give rows per second (e.g. 5000) or max", param_hint="--rate"
            )
    backends = ["sqlite"] + (["postgresql"] if postgres and os.environ.get(POSTGRES_ENV, "").strip() else [])
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
        TimeRemainingColumn(),
    )
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


# --- side by side: the journal's and the store's ways of writing a usage row ---------------------


class MappedSegment:
    """A journal segment appended to by copying into a shared mapping, for this comparison only.

    The journal writes with ``os.write`` on an ``O_APPEND`` descriptor; this is the other way it
    could: room reserved (``posix_fallocate``) and written with zeros up front, mapped
    ``MAP_SHARED``, each line copied in. Installed as the journal's ``append`` so the ledger around
    it is the same.
    """

    def __init__(self, path: Path, capacity: int) -> None:
        import mmap

        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.posix_fallocate(self.fd, 0, capacity)
        os.pwrite(self.fd, bytes(capacity), 0)
        self.view = mmap.mmap(self.fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.size = 0

    def append(self, line: bytes) -> bool:
        end = self.size + len(line)
        self.view[self.size : end] = line
        self.size = end
        return True

    def close(self) -> None:
        self.view.close()
        os.close(self.fd)


@dataclass
class Sample:
    """One repeat of one way: a median (and p99) of what it costs per request or per commit."""

    way: str
    case: str
    median_us: float
    p99_us: float


def _journal_repeat(way: str, scratch: Path, store: Store, index: int, rate: float, seconds: float) -> Sample:
    home = scratch / f"journal-{index}"
    store.delete_usage_before(_far_future(), limit=10**9)
    # No rotation in either way: a segment big enough for the whole repeat.
    ledger = Ledger.open(store, home, boot=index + 1, keep=timedelta(days=30), rotate_bytes=1 << 30)
    segment = None
    try:
        if way == "mmap copy":
            segment = MappedSegment(home / "ledger" / "mapped.jsonl", 64 << 20)
            ledger.journal.append = segment.append  # type: ignore[method-assign]
        run = Run("sqlite", f"{rate:g}")
        asyncio.run(_measure(ledger, run, rate, seconds, lambda done: None))
    finally:
        ledger.close()
        if segment is not None:
            segment.close()
    return Sample(way, f"begin+end at {rate:g}/s", statistics.median(run.call_us), run.pct(run.call_us, 99))


def _end_records(ledger_prefix: str, n: int) -> list[dict]:
    from opod.ledger import records

    found = []
    for i in range(n):
        ticket = records.UsageTicket(
            f"{ledger_prefix}-{i}", f"req-{i}", "k_bench", "u", "m", "openai", records.now_us()
        )
        found.append(
            records.finished_record(
                ticket, records.now_us(), "ok", i, 128, 900, 40, "node-a", {"worker": "node-a", "reason": "prefix"}
            )
        )
    return found


def _store_ways(store: Store, rejected: Path) -> dict[str, Callable[[list[dict]], object]]:
    """The ways a batch of end records can reach the store, each one transaction: the ledger's own
    (``commit_records``: rows checked, written through the driver's cursor), the same rows written
    through SQLAlchemy Core, and the records' values taken as built, unchecked, through the cursor."""
    from opod.ledger.records import at_us, to_row
    from opod.ledger.writer import commit_records
    from opod.store.events import APPEND_LOCK, APPEND_LOCK_ID, insert_ignoring_known
    from opod.store.usage import usage

    appender = store._ledger_appender()
    columns = [c.name for c in usage.columns if not c.primary_key and c.name != "ts"]

    def through_core(batch: list[dict]) -> None:
        # The checked values by column (a record's other keys, which the cursor leaves alone, Core would refuse).
        values = [{name: row[name] for name in (*columns, "ts")} for row in map(to_row, batch)]
        with store._write() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(APPEND_LOCK, {"id": APPEND_LOCK_ID})
            conn.execute(insert_ignoring_known(conn.dialect, usage), values)

    # The columns an end record of no project or person leaves out, at the values the ledger's rows give them.
    absent = to_row(_end_records("absent", 1)[0])

    def as_built(batch: list[dict]) -> None:
        values = [
            {
                **{name: record[name] if name in record else absent[name] for name in columns},
                "ts": at_us(record["ts_us"]),
            }
            for record in batch
        ]
        appender.append(values, [], skip_known=False)

    return {
        "commit_records: checked, raw cursor": lambda batch: commit_records(store, batch, rejected, check_known=False),
        "checked, SQLAlchemy Core": through_core,
        "as built (unchecked), raw cursor": as_built,
    }


def _store_repeat(
    way: str, commit: Callable[[list[dict]], object], backend: str, rows: int, commits: int, index: int
) -> Sample:
    cpu = []
    for n in range(commits):
        batch = _end_records(f"{way[:6]}-{index}-{n}", rows)
        started = time.thread_time()
        commit(batch)
        cpu.append((time.thread_time() - started) * 1e6)
    return Sample(
        way,
        f"{backend}, {rows} row{'s' if rows > 1 else ''} a commit (CPU)",
        statistics.median(cpu),
        statistics.quantiles(cpu, n=100)[98],
    )


def _summary(samples: list[Sample]) -> list[list[str]]:
    table = []
    for case in dict.fromkeys(s.case for s in samples):
        for way in dict.fromkeys(s.way for s in samples if s.case == case):
            mine = [s.median_us for s in samples if s.case == case and s.way == way]
            tails = [s.p99_us for s in samples if s.case == case and s.way == way]
            table.append(
                [
                    case,
                    way,
                    str(len(mine)),
                    _f(statistics.median(mine)),
                    f"{_f(min(mine))}–{_f(max(mine))}",
                    _f(statistics.median(tails)),
                ]
            )
    return table


PATH_HEADERS = ["case", "way", "repeats", "median of medians µs", "spread of medians µs", "median p99 µs"]


def paths(
    repeats: int = typer.Option(5, help="Repeats of each way, in turns."),
    seconds: float = typer.Option(1.5, help="Seconds of begin/end calls per journal repeat."),
    rate: float = typer.Option(5000.0, help="Offered requests/s in the journal repeats."),
    commits: int = typer.Option(200, help="Commits per store repeat; 0 leaves the store's ways out."),
    results: Path = typer.Option(RESULTS, help="Where usage-write-paths.md goes."),
) -> None:
    """The journal's (os.write vs an mmap copy) and the store's ways of writing a row, side by side in turns."""
    backends = ["sqlite"] + (["postgresql"] if os.environ.get(POSTGRES_ENV, "").strip() else [])
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory() as scratch:
        with _database("sqlite", Path(scratch)) as url:
            store = Store.open(url)
            try:
                for i in range(repeats):
                    order = ("os.write", "mmap copy") if i % 2 == 0 else ("mmap copy", "os.write")
                    for j, way in enumerate(order):
                        samples.append(_journal_repeat(way, Path(scratch), store, 2 * i + j, rate, seconds))
                        console.print(f"[dim]journal {way}: {samples[-1].median_us:.1f} µs[/]")
            finally:
                store.close()
        for backend in backends if commits > 0 else []:
            with _database(backend, Path(scratch) / backend if backend == "sqlite" else Path(scratch)) as url:
                if backend == "sqlite":
                    (Path(scratch) / backend).mkdir(exist_ok=True)
                store = Store.open(url)
                try:
                    ways = _store_ways(store, Path(scratch) / "rejected.jsonl")
                    for i in range(repeats):
                        names = list(ways) if i % 2 == 0 else list(reversed(ways))
                        for rows in (1, 25):
                            for way in names:
                                samples.append(_store_repeat(way, ways[way], backend, rows, commits, i))
                                console.print(f"[dim]{backend} {rows} {way}: {samples[-1].median_us:.1f} µs[/]")
                finally:
                    store.close()
    table = Table(title="usage write paths, side by side", header_style="bold")
    for header in PATH_HEADERS:
        table.add_column(header)
    summary = _summary(samples)
    for row in summary:
        table.add_row(*row)
    console.print(table)
    lines = [
        f"# Usage write paths side by side ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} CPUs)",
        "",
        f"`python -m bench.usage paths --repeats {repeats} --seconds {seconds:g} --rate {rate:g} --commits {commits}`",
        "",
        "| " + " | ".join(PATH_HEADERS) + " |",
        "|" + "---|" * len(PATH_HEADERS),
        *("| " + " | ".join(row) + " |" for row in summary),
    ]
    results.mkdir(parents=True, exist_ok=True)
    (results / "usage-write-paths.md").write_text("\n".join(lines) + "\n")
    console.print(f"[dim]written: {results / 'usage-write-paths.md'}[/]")


if __name__ == "__main__":
    cli = typer.Typer(no_args_is_help=True)
    cli.command("usage")(command)
    cli.command("paths")(paths)
    cli()
