"""How fast the operator console's pages are with a big fleet: each page's HTML served, and its first rows in Chromium.

A leader is opened in this process on a store filled with ``--nodes`` nodes (the fleet-scale
benchmark's shape: 8 GPUs each, labelled) and ``--keys`` API keys, and its admin app (the
listener's checks included) is served on a loopback port with a fixed admin signed in. Each page is
fetched ``--rounds`` times over HTTP; the table gives p50 and p99 of the time to its whole HTML.
When Debian's Chromium and Playwright's Python package are there, each page is also loaded in
headless Chromium and the time from navigation to its first rows on screen is measured. Before
serving, the process's start-up heap leaves the collector's passes as ``opod up`` does
(:func:`~opod.http.serving.settle_memory`); with ``--repeats``, each HTML figure is the median of
that many runs, and the load average before and after is written with the table.

Goal (issue 32): p99 ≤ 50 ms for the HTML, first rows ≤ 300 ms, at 1,000 nodes and 100,000 keys.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import typer
import uvicorn
from rich.console import Console
from rich.table import Table
from sqlalchemy import insert

from bench.fleet_scale.shape import capabilities, node_id
from bench.ports import free_port
from opod.control.app import create_app
from opod.control.console.auth import Viewer
from opod.http.serving import settle_memory
from opod.leader.leader import Leader, LeaderSettings
from opod.store import Store
from opod.store.keys import search_terms
from opod.store.schema import key_terms
from opod.store.schema import keys as keys_table

console = Console()
RESULTS = Path(__file__).parent / "results"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGES = {
    "summary": "/console",
    "nodes": "/console/nodes",
    "nodes, filtered": "/console/nodes?q=rack-031",
    "nodes, last page": "/console/nodes?page={last}",
    "models": "/console/models",
    "keys": "/console/keys",
    "keys, filtered": "/console/keys?q=svc-99999",
    "keys, revoked": "/console/keys?state=revoked",
    "usage": "/console/usage",
    "audit": "/console/audit",
    "settings": "/console/settings",
}
FIRST_ROWS = {"summary": "main .card", "settings": "textarea"}
"""What a page's first rows are, when not a list's rows."""


class BenchAdmin:
    """An admin signed in for every request."""

    person = Viewer(actor="bench@example.com", name="Bench", role="admin")

    async def viewer(self, request: Any) -> Viewer | None:
        return self.person

    def may(self, viewer: Viewer, action: str) -> bool:
        return True

    def csrf_token(self, request: Any) -> str:
        return "bench"


def fill(home: Path, nodes: int, keys: int) -> None:
    """``nodes`` registered nodes and ``keys`` API keys (one in ten revoked), written in a few transactions."""
    home.mkdir(parents=True, exist_ok=True)
    with Store.open(None, home=home) as store:
        for i in range(nodes):
            caps = capabilities(i)
            store.upsert_node(
                node_id(i),
                hostname=caps.hostname,
                os="linux",
                arch="x86_64",
                ram_gb=2048,
                address="127.0.0.1:9",
                hardware_json=caps.model_dump_json(),
            )
        now = datetime.now(UTC)
        rows = [
            {
                "id": f"k_{i:016x}",
                "kind": "api",
                "name": f"svc-{i}",
                "hash": f"{i:064x}",
                "prefix": f"sk-orc-{i:06x}"[:12],
                "team": "",
                "admission_class": "",
                "created_at": now - timedelta(seconds=keys - i),
                "expires_at": None,
                "revoked_at": now if i % 10 == 0 else None,
                "last_used_at": None,
                "node_id": None,
            }
            for i in range(keys)
        ]
        terms = [
            {"term": term, "key_id": row["id"]}
            for row in rows
            for term in search_terms(row["id"], row["name"], row["prefix"])
        ]
        with store.engine.begin() as conn:
            for start in range(0, len(rows), 5000):
                conn.execute(insert(keys_table), rows[start : start + 5000])
            for start in range(0, len(terms), 5000):
                conn.execute(insert(key_terms), terms[start : start + 5000])


def serve(app: Any) -> tuple[str, uvicorn.Server]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True).start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server


def html_times(
    base: str, rounds: int, last: int, beat: Callable[[], None], repeats: int = 1
) -> dict[str, tuple[float, float, int]]:
    """page → (p50 ms, p99 ms, bytes), each time the median of ``repeats`` runs of ``rounds`` fetches."""
    runs = [html_run(base, rounds, last, beat) for _ in range(repeats)]
    return {
        name: (
            statistics.median(run[name][0] for run in runs),
            statistics.median(run[name][1] for run in runs),
            runs[-1][name][2],
        )
        for name in runs[0]
    }


def html_run(base: str, rounds: int, last: int, beat: Callable[[], None]) -> dict[str, tuple[float, float, int]]:
    """page → (p50 ms, p99 ms, bytes)."""
    out = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        for name, path in PAGES.items():
            path = path.format(last=last)
            beat()
            for _ in range(3):
                client.get(path).raise_for_status()
            times, size = [], 0
            for _ in range(rounds):
                started = time.perf_counter()
                answer = client.get(path)
                times.append((time.perf_counter() - started) * 1000)
                answer.raise_for_status()
                size = len(answer.content)
            times.sort()
            out[name] = (statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))], size)
    return out


def browser_times(base: str, loads: int, last: int, beat: Callable[[], None]) -> dict[str, float] | str:
    """page → median ms from navigation to its first rows in headless Chromium; or why it was not measured."""
    if not CHROMIUM.is_file():
        return f"not measured: no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "not measured: Playwright's Python package is not installed (pip install -e '.[bench]')"
    out = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        for name, path in PAGES.items():
            wanted = FIRST_ROWS.get(name, "tbody tr")
            beat()
            times = []
            for _ in range(loads + 1):
                started = time.perf_counter()
                page.goto(base + path.format(last=last), wait_until="commit")
                page.wait_for_selector(wanted, state="visible")
                times.append((time.perf_counter() - started) * 1000)
            out[name] = statistics.median(times[1:])
        browser.close()
    return out


def command(
    nodes: int = typer.Option(1000, help="Nodes in the fleet."),
    keys: int = typer.Option(100_000, help="API keys in the store."),
    rounds: int = typer.Option(200, help="Fetches of each page's HTML."),
    loads: int = typer.Option(5, help="Loads of each page in Chromium."),
    repeats: int = typer.Option(1, help="Runs of the HTML fetches; each HTML figure is the median over them."),
    results: Path = typer.Option(RESULTS, help="Where console.md goes."),
) -> None:
    """Each console page's HTML time (p50, p99) and first rows in Chromium, at NODES nodes and KEYS keys."""
    with tempfile.TemporaryDirectory(prefix="opod-console-bench-") as tmp:
        home = Path(tmp) / "home"
        started = time.monotonic()
        fill(home, nodes, keys)
        os.environ["OPOD_HOME"] = str(home)
        leader = Leader.open(LeaderSettings(home=home, default_models=False))

        def beat() -> None:
            """As if each node had just sent its heartbeat: before each page, so the fleet stays live throughout."""
            now = time.monotonic()
            for node in leader.fleet:
                node.last_heartbeat = now

        beat()
        settle_memory()
        console.print(f"store filled and leader open in {time.monotonic() - started:.1f} s")
        base, server = serve(create_app(leader.control, BenchAdmin()))
        try:
            last = max(1, -(-nodes // 50))
            load_before = os.getloadavg()[0]
            html = html_times(base, rounds, last, beat, repeats)
            load_after = os.getloadavg()[0]
            first = browser_times(base, loads, last, beat)
        finally:
            server.should_exit = True
    table = Table(title=f"console pages, {nodes:,} nodes and {keys:,} keys")
    for column in ("page", "HTML p50 ms", "HTML p99 ms", "KiB", "first rows in Chromium ms"):
        table.add_column(column, justify="left" if column == "page" else "right")
    lines = [
        "# Console pages: HTML served and first rows in Chromium",
        "",
        f"`python -m bench console --nodes {nodes} --keys {keys} --rounds {rounds} --loads {loads} "
        f"--repeats {repeats}` on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}), "
        f"SQLite store; load average {load_before:.1f} before the HTML fetches, {load_after:.1f} after. "
        "HTML: the whole answer over loopback HTTP, the admin listener's checks included"
        f"{f', the median of {repeats} runs' if repeats > 1 else ''}. First rows: "
        "navigation to the page's first rows visible, median of the loads after a first one.",
        "",
        "| page | HTML p50 ms | HTML p99 ms | KiB | first rows in Chromium ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (p50, p99, size) in html.items():
        shown = f"{first[name]:.0f}" if isinstance(first, dict) else "–"
        table.add_row(name, f"{p50:.1f}", f"{p99:.1f}", f"{size / 1024:.0f}", shown)
        lines.append(f"| {name} | {p50:.1f} | {p99:.1f} | {size / 1024:.0f} | {shown} |")
    if isinstance(first, str):
        lines += ["", first]
    console.print(table)
    results.mkdir(parents=True, exist_ok=True)
    (results / "console.md").write_text("\n".join(lines) + "\n")
    console.print(f"written to {results / 'console.md'}")
