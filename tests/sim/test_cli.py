"""``opod sim`` on the command line: the banner, clear errors for bad options, vLLM's silent load phase."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from opod.cli.main import app
from opod.http.serving import YOUNG_COLLECTION_AT


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--kv-blocks", "0"], "--kv-blocks"),
        (["--dialect", "tgi"], "--dialect"),
        (["--fail-rate", "1.5"], "--fail-rate"),
        (["--output-min", "50", "--output-max", "10"], "--output-min"),
        (["--kv-events", "localhost:5557"], "--kv-events"),
        (["--kv-events-bind", "localhost:5557"], "--kv-events-bind"),
        (["--model", "a", "--model", "a"], "--model"),
        (["--stall-at", "end"], "--stall-at"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["sim", "--port", "0", *args])
    assert result.exit_code == 2
    assert named in result.output and "error:" in result.output


def test_python_m_opod_sim_prints_a_banner_and_vllm_refuses_connections_while_loading(sim_process) -> None:
    p = sim_process("--load-ms", "1500", "--model", "a", "--model", "b", "--seed", "4", wait_listening=False)
    assert p.banner.startswith("opod sim: listening on http://127.0.0.1:")
    assert "dialect vllm" in p.banner and "model a, b" in p.banner and "seed 4" in p.banner
    with pytest.raises(httpx.ConnectError):
        httpx.get(p.url + "/health", timeout=1)
    deadline = time.monotonic() + 15
    while True:
        try:
            r = httpx.get(p.url + "/health", timeout=1)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the simulator never started listening"
            time.sleep(0.05)
    assert (r.status_code, r.content) == (200, b"")
    assert [m["id"] for m in httpx.get(p.url + "/v1/models").json()["data"]] == ["a", "b"]


def test_a_served_simulator_keeps_its_start_up_objects_out_of_the_collectors_passes() -> None:
    # A collector pass over the simulator's heap would stall every request in flight and show as
    # engine latency that the latency model did not ask for.
    script = (
        "import gc, os\n"
        "from opod.sim.config import SimConfig\n"
        "from opod.sim.server import serve\n"
        "def announce(line):\n"
        "    print(gc.get_freeze_count(), gc.get_threshold()[0], flush=True)\n"
        "    os._exit(0)\n"
        "serve(SimConfig(port=0), announce=announce)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    frozen, young_threshold = map(int, done.stdout.split())
    assert frozen > 10_000, "start-up objects (modules, the app) should be frozen before serving"
    assert young_threshold == YOUNG_COLLECTION_AT
