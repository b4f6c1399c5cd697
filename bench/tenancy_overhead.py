"""What tenancy, budgets and audit add to a ``/v1`` request, side by side with them off, in one run.

1. In process, no network: the per-request work they add to the gateway (the key's project to its
   team and org, the scopes, the reservation priced and held, the cost at the end and the
   settlement), timed over many requests against the same request without them.
2. End to end: two leaders with a zero-latency simulator each, started together: "off" (no tree,
   no settings: the admin key) and "on" (an org, team and project; the project's key; prices and
   a budget on each of the three levels, large enough never to refuse; every management change
   audited). Open-loop Poisson arrivals at the same rate on both, rounds interleaved so drift on
   the shared CPUs hits both, and the latency each adds at p50, p90 and p99.

Goal: no more than 0.2 ms added at p50.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bench import loadgen
from bench.ports import free_port
from bench.procs import OPOD, Proc, wait_http
from opod.access.keytable import KeyEntry
from opod.access.tenancy import ProjectChain
from opod.gateway.budgets import Budgets
from opod.gateway.exchange import Exchange
from opod.gateway.meter import Meter
from opod.gateway.outcome import Outcome
from opod.gateway.promptsize import completion_bound, prompt_size
from opod.gateway.stats import GatewayStats
from opod.ledger.records import UsageTicket
from opod.settings.schema import Budget, ClusterSettings, Price

console = Console()
RESULTS = Path(__file__).parent / "results"
MODEL = "sim-chat"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
SETTINGS = (
    "prices:\n  '*': {input_per_million: 0.5, output_per_million: 1.5}\n"
    "budgets:\n  - {scope: org:acme, period: month, micros: 1000000000000}\n"
    "  - {scope: team:acme/ml, period: week, micros: 1000000000000}\n"
    "  - {scope: project:acme/ml/chat, period: day, micros: 1000000000000}\n"
)


# --- 1. in process ------------------------------------------------------------------------


class _Ledger:
    """Takes the rows and drops them: only the gateway's own work is timed."""

    def begin(self, **start: object) -> UsageTicket:
        return UsageTicket("e", "r", "k", "u", MODEL, "openai", 0)

    def end(self, ticket: UsageTicket, **end: object) -> None:
        pass

    def progress(self, ticket: UsageTicket, **progress: object) -> None:
        pass


class _Chains:
    def __init__(self) -> None:
        self.chains = {"prj_chat": ProjectChain("prj_chat", "team_ml", "org_acme")}

    def chain(self, project_id: str) -> ProjectChain | None:
        return self.chains.get(project_id)


class _Held:
    def __init__(self, settings: ClusterSettings) -> None:
        self.current = settings


def _one(meter: Meter, key: KeyEntry) -> None:
    """What the gateway does for one request's bookkeeping, from the key check to the usage row."""
    exchange = Exchange(meter, "r", "openai.chat.completions", False, False)
    exchange.identified(key)
    payload = dict(BODY)
    exchange.parsed(MODEL, payload)
    budgets = meter.budgets
    if budgets is not None and exchange.budgeted:
        prompt = prompt_size(payload)
        exchange.reserved(budgets.cost(MODEL, prompt.bound(), completion_bound(payload, 2048, prompt, 4096)))
    exchange.relaying()
    exchange.sent()
    exchange.ended(Outcome(200, "ok", usage={"prompt_tokens": 12, "completion_tokens": 8}))


def in_process(requests: int, rounds: int) -> dict[str, float]:
    """Microseconds per request's bookkeeping, off and on (the median of ``rounds`` interleaved rounds)."""
    settings = ClusterSettings(
        prices={"*": Price(input_per_million=0.5, output_per_million=1.5)},
        budgets=[
            Budget(scope="org:org_acme", period="month", micros=10**15),
            Budget(scope="team:team_ml", period="week", micros=10**15),
            Budget(scope="project:prj_chat", period="day", micros=10**15),
        ],
    )
    budgets = Budgets(settings=_Held(settings), clock=lambda: datetime.now(UTC))
    budgets.configure()
    plain = KeyEntry(id="k_admin", kind="admin", name="admin", hash="h")
    project = KeyEntry(id="k_chat", kind="api", name="chat", hash="h2", project_id="prj_chat", user_id="usr_1")
    stats, ledger = GatewayStats(), _Ledger()
    off = Meter(ledger, stats)
    on = Meter(ledger, stats, budgets=budgets, tenancy=_Chains())
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode, key, meter in (("off", plain, off), ("on", project, on)):
            start = time.perf_counter()
            for _ in range(requests):
                _one(meter, key)
            times[mode].append((time.perf_counter() - start) / requests * 1e6)
    return {mode: statistics.median(values) for mode, values in times.items()}


# --- 2. end to end --------------------------------------------------------------------------


def _admin(url: str, key: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode() if body is not None else None, method=method
    )
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{method} {path}: {err.code} {err.read().decode(errors='replace')}") from None


class _Up:
    def __init__(self, home: Path) -> None:
        port, self.admin_port = free_port(), free_port()
        self.proc = Proc(
            [
                "up",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{self.admin_port}",
                "--worker-listen",
                f"127.0.0.1:{free_port()}",
                "--engine",
                "sim",
                "--no-default-models",
            ],
            home,
            env={"OPOD_ENGINE_FLAGS": json.dumps({"time_scale": 0, "max_num_seqs": 1024})},
        )
        self.url, self.home = f"http://127.0.0.1:{port}", home

    def ready(self) -> None:
        self.proc.wait_for("OpenAI API on", 60)
        self.key = (self.home / "admin.key").read_text().strip()
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
        env.update(OPOD_HOME=str(self.home), OPOD_ADMIN_URL=self.admin_url)
        subprocess.run(
            [*OPOD, "model", "add", MODEL, "--engine", "sim"], env=env, check=True, capture_output=True, timeout=60
        )
        self.proc.wait_for(rf"{MODEL} serving on", 60)
        wait_http(self.url + "/readyz")


def end_to_end(rate: float, seconds: float, rounds: int) -> dict[str, loadgen.Result]:
    with tempfile.TemporaryDirectory() as scratch:
        off, on = _Up(Path(scratch) / "off"), _Up(Path(scratch) / "on")
        try:
            off.ready()
            on.ready()
            for path, body in (
                ("/api/v1/orgs", {"name": "acme"}),
                ("/api/v1/teams", {"name": "ml", "in": "acme"}),
                ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
            ):
                _admin(on.admin_url, on.key, "POST", path, body)
            _admin(on.admin_url, on.key, "PUT", "/api/v1/settings", {"base": 0, "body": SETTINGS})
            secret = _admin(on.admin_url, on.key, "POST", "/api/v1/keys", {"name": "bench", "project": "acme/ml/chat"})[
                "secret"
            ]
            body = json.dumps(BODY).encode()
            paths = {"off": (off.url, off.key), "on": (on.url, secret)}
            merged = {mode: loadgen.Result() for mode in paths}
            for url, key in paths.values():  # warm both
                asyncio.run(loadgen.open_loop(url + "/v1/chat/completions", body, _headers(key), rate, 1.0, seed=99))
            for n in range(rounds):
                order = (
                    list(paths.items()) if n % 2 == 0 else list(reversed(paths.items()))
                )  # neither always goes first
                for mode, (url, key) in order:
                    with loadgen.collector_paused():
                        got = asyncio.run(
                            loadgen.open_loop(url + "/v1/chat/completions", body, _headers(key), rate, seconds, seed=n)
                        )
                    merged[mode].latencies += got.latencies
                    merged[mode].errors += got.errors
                    merged[mode].elapsed += got.elapsed
        finally:
            off.proc.stop()
            on.proc.stop()
    return merged


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


# --- the report -------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def report(micro: dict[str, float], e2e: dict[str, loadgen.Result] | None, rate: float, out: Path) -> str:
    lines = [
        f"# Tenancy, budgets and audit on `/v1`: off vs on ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs)",
        "",
    ]
    lines += [
        "## In process: the gateway's bookkeeping per request (attribution, reservation, pricing, settlement)",
        "",
        "| | µs per request |",
        "|---|---|",
        f"| off (a key of no project, no prices, no budgets) | {micro['off']:.2f} |",
        f"| on (a project's key, its team and org, prices, a budget on each level) | {micro['on']:.2f} |",
        f"| **added** | **{micro['on'] - micro['off']:.2f}** |",
        "",
    ]
    if e2e is not None:
        off, on = e2e["off"], e2e["on"]
        lines += [
            f"## End to end: two leaders, zero-latency simulator, open loop at {rate:.0f} req/s, rounds interleaved",
            "",
            "Load generator, both leaders and their simulators share the same CPUs.",
            "",
            "| | requests | p50 ms | p90 ms | p99 ms | errors |",
            "|---|---|---|---|---|---|",
            f"| off | {len(off.latencies)} | {_ms(off.pct(50))} | {_ms(off.pct(90))} | {_ms(off.pct(99))} | {off.errors} |",
            f"| on | {len(on.latencies)} | {_ms(on.pct(50))} | {_ms(on.pct(90))} | {_ms(on.pct(99))} | {on.errors} |",
            f"| **added** | | **{_ms(on.pct(50) - off.pct(50))}** | {_ms(on.pct(90) - off.pct(90))} | "
            f"{_ms(on.pct(99) - off.pct(99))} | |",
            "",
        ]
    lines += ["Goal: no more than 0.2 ms added at p50.", ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tenancy-overhead.md").write_text(text)
    if e2e is not None:
        _plot(e2e, rate, out)
    return text


def _plot(e2e: dict[str, loadgen.Result], rate: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, label in (("off", "tenancy, budgets, audit off"), ("on", "on")):
        values = sorted(v * 1000 for v in e2e[mode].latencies)
        if values:
            ax.plot(values, [i / len(values) for i in range(len(values))], label=label)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"/v1 through opod, zero-latency simulator, {rate:.0f} req/s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "tenancy-overhead.png", dpi=120)
    plt.close(fig)


def command(
    rate: float = typer.Option(150.0, help="Requests per second, open loop, on each leader."),
    seconds: float = typer.Option(5.0, help="Seconds per measured round."),
    rounds: int = typer.Option(3, help="Interleaved rounds per mode."),
    requests: int = typer.Option(20_000, help="Requests per in-process round."),
    skip_e2e: bool = typer.Option(False, "--skip-e2e", help="Only the in-process measure."),
    results: Path = typer.Option(RESULTS, help="Where the table and plot go."),
) -> None:
    """What tenancy, budgets and audit add to a /v1 request: in process and end to end, off vs on."""
    with console.status("in process: off and on, interleaved"):
        micro = in_process(requests, rounds * 2 + 1)
    e2e = None
    if not skip_e2e:
        with console.status(f"end to end: two leaders, {rounds} rounds of {seconds:.0f} s each at {rate:.0f} req/s"):
            e2e = end_to_end(rate, seconds, rounds)
    report(micro, e2e, rate, results)
    console.print(_table(micro, e2e))
    console.print(
        f"[dim]written: {results / 'tenancy-overhead.md'}" + (" and tenancy-overhead.png" if e2e else "") + "[/]"
    )


def _table(micro: dict[str, float], e2e: dict[str, loadgen.Result] | None) -> Table:
    table = Table(title="tenancy, budgets and audit on /v1", header_style="bold")
    for column in ("measure", "off", "on", "added", "goal"):
        table.add_column(column)
    table.add_row(
        "in process: µs per request",
        f"{micro['off']:.2f}",
        f"{micro['on']:.2f}",
        f"{micro['on'] - micro['off']:.2f}",
        "",
    )
    if e2e is not None:
        off, on = e2e["off"], e2e["on"]
        for q, goal in ((50, "≤ 0.2 ms"), (90, ""), (99, "")):
            table.add_row(f"end to end: p{q} ms", _ms(off.pct(q)), _ms(on.pct(q)), _ms(on.pct(q) - off.pct(q)), goal)
        table.add_row("end to end: errors", str(off.errors), str(on.errors), "", "0")
    return table
