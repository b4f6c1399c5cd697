"""``python -m bench routing`` at its smallest: two simulator workers, every workload through every path for a moment.

Paths run: direct, opod (prefix policy and round robin), the bare Python relay, vllm-router (kv_aware and cache_aware)
and sglang-router, the routers installed into their own virtual environments on first use (about 15 s each). LiteLLM
is left out: its install is 760 MB and about 60 s, and its proxy takes a further 20 to 30 s to start on two cores,
more than this suite's whole budget for benchmark smoke runs; `python -m bench routing` still runs it by default.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import by_measure, md_table, number, run_bench

PATHS = ("direct", "opod", "opod-rr", "relay-floor", "vllm-router", "vllm-router-cache", "sglang-router")
ROUTERS = tuple(p for p in PATHS if p not in ("direct", "relay-floor"))


def test_every_path_answers_every_workload_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench(
        "routing",
        "--quick",
        "--workers",
        "2",
        *(arg for path in PATHS for arg in ("--path", path)),
        *("--concurrency", "4", "--closed-seconds", "0.5", "--loads", "0.5", "--open-seconds", "0.5"),
        *("--stream-seconds", "0.5", "--prefix-seconds", "1", "--prefix-rate", "8", "--groups", "2"),
        *("--system-tokens", "32", "--turns", "2", "--output-tokens", "4", "--drain", "10"),
        "--results",
        str(results),
        timeout=420,
    )
    text = (results / "routing.md").read_text()
    table = by_measure(md_table(text, "measure"))
    for path in PATHS:
        assert table["status"][path] == "ran", (path, table["status"][path])
        assert number(table["1 short chat: req/s at saturation (best of concurrency 4…4)"][path]) > 0, path
        assert table["1 short chat: errors (closed + open loop)"][path] == "0", path
        assert table["2 streamed: errors"][path] == "0", path
    prefix = next(v for k, v in table.items() if k.startswith("3 shared prefix: error rate"))
    for path in ROUTERS:
        rate, sent = prefix[path].split(" (")[0], number(prefix[path].split("/")[1])
        assert rate == "0.0%" and sent > 0, (path, prefix[path])
    notes = {row["path"]: row["status"] for row in md_table(text, "path")}
    assert not [p for p, status in notes.items() if "errors" in status or "failed" in status], notes
    assert "prefix credit appeared" in notes["vllm-router"]  # kv_aware really subscribed to the engines' KV events
    assert sorted(p.name for p in results.glob("routing-*.png")) == [
        "routing-added-latency.png",
        "routing-saturation.png",
        "routing-ttft-cdf.png",
    ]
