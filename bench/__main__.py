"""``python -m bench <benchmark> [options]``: run one of opod's benchmarks."""

from __future__ import annotations

import typer

from bench import (
    admission,
    compare,
    console,
    dataplane,
    fleet_scale,
    idle_ab,
    loop_core,
    plumbing,
    routing,
    stages,
    tenancy_overhead,
    usage,
)
from bench.stages import ab as stages_ab
from bench.stages import areas as stages_areas
from bench.stages import lines as stages_lines

app = typer.Typer(
    help="opod's benchmarks. Results go to bench/results/ as a markdown table and PNG plots.", no_args_is_help=True
)
app.command("dataplane")(dataplane.command)
app.command("admission")(admission.command)
app.command("usage")(usage.command)
app.command("routing")(routing.command)
app.command("fleet-scale")(fleet_scale.command)
app.command("tenancy-overhead")(tenancy_overhead.command)
app.command("compare")(compare.command)
app.command("stages")(stages.command)
app.command("stages-ab")(stages_ab.command)
app.command("stages-areas")(stages_areas.command)
app.command("lines")(stages_lines.command)
app.command("console")(console.command)
app.command("idle-ab")(idle_ab.command)
app.command("plumbing")(plumbing.command)
app.command("loop-core")(loop_core.command)


@app.callback()
def main() -> None:
    """Run one benchmark; each prints a table and writes its results."""


if __name__ == "__main__":
    app()
