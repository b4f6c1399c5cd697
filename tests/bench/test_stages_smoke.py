"""``python -m bench stages`` at its smallest, as a user runs it: real leaders, workers and simulators on loopback.

Its tables go to a temporary folder, never over the committed results. Flame graphs are drawn only
where py-spy is installed (it is no test dependency); the bench says so when it skips them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from bench.stages.attribution import ORDER
from bench.stages.fleet import ALL_ON, CONFIGS
from bench.stages.measure import py_spy

REPO = Path(__file__).resolve().parents[2]


def test_the_smallest_run_writes_every_stage_and_every_configuration(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    env["PYTHONPATH"] = str(REPO)
    args = ["--requests", "24", "--rate", "40", "--seconds", "0.6", "--rounds", "1", "--warm", "0.2"]
    args += ["--timed", "10", "--flame-seconds", "1", "--saturation-seconds", "1", "--results-dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "bench", "stages", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    data = json.loads((tmp_path / "stages.json").read_text())
    costs = {row["stage"]: row for row in data["stages"]}
    assert list(costs) == ORDER
    assert all(row["cpu_us"] >= 0 and row["wall_us"] >= 0 for row in costs.values())
    assert sum(row["cpu_us"] for row in costs.values()) > 0

    configs = {row["name"]: row for row in data["configs"]}
    assert list(configs) == [c.name for c in CONFIGS]
    # The guardrail both ways, each added to tenancy; all on has the guard policy, run in process, and no webhook.
    assert {"guardrail", "guard-policy"} <= set(configs) and configs["guard-policy"]["base"] == "tenancy"
    on = next(c for c in CONFIGS if c.name == ALL_ON).areas
    assert on.guard_policy and not on.guardrail
    # Prefix routing as compare mounts it, on two workers (checked to reach both before measuring), added to tenancy.
    assert on.routing and configs["routing"]["base"] == "tenancy"
    for name in ("guard-policy", ALL_ON):
        assert "guard_action allow, guard_policy screen" in configs[name]["guard_check"], configs[name]
    assert not configs["guardrail"]["guard_check"]
    for name, row in configs.items():
        assert row["errors"] == 0 and set(row["statuses"]) == {"200"}, (name, row)
        assert row["answered"] > 0, name
        # Counted, not judged: rounds this short are a few of /proc's 10 ms ticks.
        assert math.isfinite(row["kernel_us"]) and math.isfinite(row["wakes"]), (name, row)

    table = (tmp_path / "stages.md").read_text()
    assert all(f"| {stage} |" in table for stage in ORDER)
    assert "| of which kernel | event loop wake-ups/req |" in table and "The kernel's part:" in table
    assert "| + guard policy (in process: pii and pattern checks) |" in table
    assert (
        "| all on: tenancy, price & budget, kept bodies, guard policy (in process; no webhook), prefix routing |"
        in table
    )
    assert "| + prefix routing (the prefix policy, two workers) |" in table
    assert "- The guardrail, added to tenancy: as webhooks" in table
    if py_spy() is None:
        assert "flame graphs skipped: py-spy is not installed" in done.stdout
        assert "Skipped: py-spy is not installed" in table
    else:
        assert (tmp_path / "stages-all.svg").stat().st_size > 0
        assert (tmp_path / "stages-nothing.svg").stat().st_size > 0
        assert "shows as `Runner.run` with no Python function above it" in table  # what the graphs leave unnamed
