"""``python -m bench compare`` at its smallest: two simulator workers, one short round of every measurement.

Every path it compares runs: direct, opod with every governance area on (set up through ``opod ctl``, checked on one
request's record), the bare Python relay (a yardstick) and sglang-router, installed into its own virtual environment on first use (about 15 s).
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import by_measure, md_table, number, run_bench

PATHS = ("direct", "opod", "relay-floor", "sglang-router")


def test_every_path_answers_every_measurement_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench(
        "compare",
        *("--workers", "2", "--rounds", "1", "--seconds", "0.5", "--capacity-level", "16"),
        *("--capacity-seconds", "0.5", "--open-seconds", "0.5", "--zero-level", "8", "--zero-seconds", "0.5"),
        *("--zero-rounds", "1", "--results", str(results), "--name", "smoke"),
        timeout=300,
    )
    text = (results / "smoke.md").read_text()
    assert "`python -m bench compare --workers 2" in text and "on commit `" in text
    table = by_measure(md_table(text, "measure"))
    for path in PATHS:
        assert table["status"][path] == "ran", (path, table["status"][path])
        answered, failed = (number(part) for part in table["requests answered / failed (every phase)"][path].split("/"))
        assert answered > 0 and failed == 0, (path, answered, failed)
        saturation = next(v for k, v in table.items() if k.startswith("saturation req/s"))
        assert number(saturation[path]) > 0, path
        for measure, row in table.items():
            if measure.startswith(("chat", "streamed")):
                number(row[path])  # every latency cell measured (a dash would be a path that answered nothing)
    cpu = next(v for k, v in table.items() if k.startswith("the router's CPU ms per request"))
    # Read from /proc in clock ticks (10 ms): a few requests of a light router may cost none, but it is measured.
    assert all(number(cpu[path]) >= 0 for path in PATHS[1:]) and cpu["direct"] == "—"
    assert text.count("cost ") == 2 and text.count("guardrail screen allow") == 2 and "body kept" in text  # both fleets
    assert sorted(p.name for p in results.glob("smoke-*.png")) == [
        "smoke-added.png",
        "smoke-open-loop-cdf.png",
        "smoke-saturation.png",
    ]
