"""Peers: what vllm-router's kv_aware needs and what its metrics say it did, and a failed install reported with its reason."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from aiohttp import web

from bench.routing import fleet, peers
from opod.engines.base import LaunchSpec
from opod.engines.errors import LaunchError
from opod.engines.registry import get_driver


def _engine(render: int) -> tuple[str, callable]:
    """A stand-in engine on a thread whose render endpoint answers ``render`` (200, or vLLM's 403 without scale-out); 0: none."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def rendered(request: web.Request) -> web.Response:
        return web.json_response({"token_ids": [1, 2, 3]}, status=render)

    async def setup() -> None:
        app = web.Application()
        if render:
            app.router.add_post("/v1/chat/completions/render", rendered)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"] = runner
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(setup()), loop.run_forever()), daemon=True)
    thread.start()
    started.wait(10)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return box["url"], stop


@pytest.mark.parametrize(
    ("endpoint", "render", "expected"),
    [
        (None, 0, ["publish no KV events vllm-router can subscribe to", "no POST /v1/chat/completions/render"]),
        ("tcp://*:5557", 200, ["publish no KV events vllm-router can subscribe to"]),  # a wildcard is nothing to dial
        ("tcp://127.0.0.1:5557", 403, ["no POST /v1/chat/completions/render"]),
        ("tcp://127.0.0.1:5557", 200, []),
    ],
)
def test_kv_aware_needs_a_dialable_kv_event_endpoint_per_engine_and_the_render_endpoint(
    endpoint: str | None, render: int, expected: list[str]
) -> None:
    url, stop = _engine(render)
    try:
        gap = peers.kv_aware_gap([url], {url: endpoint} if endpoint else {})
    finally:
        stop()
    if not expected:
        assert gap == ""
    for words in expected:
        assert words in gap
    if endpoint == "tcp://127.0.0.1:5557":
        assert "KV events" not in gap


METRICS = """# TYPE vllm_router_kv_placement_lookups_total counter
vllm_router_kv_placement_lookups_total{result="miss"} 12
vllm_router_kv_placement_lookups_total{result="hit"} 30
# TYPE vllm_router_kv_routing_inputs_total counter
vllm_router_kv_routing_inputs_total{transport="http",result="render"} 84
vllm_router_requests_total{route="/v1/chat/completions"} 42
"""


def test_the_credit_note_reads_placement_lookups_over_the_phase_only() -> None:
    before = peers.parse_kv_counters(METRICS.replace("} 30", "} 10").replace("} 12", "} 2"))
    after = peers.parse_kv_counters(METRICS)
    assert len(after) == 3  # only the KV counters
    note = peers.kv_credit_note(before, after, "the shared-prefix phase")
    assert "prefix credit appeared: 20 of 30 placement lookups hit" in note and "miss 10" in note
    none = peers.kv_credit_note(before, peers.parse_kv_counters(METRICS.replace("} 30", "} 10")), "p")
    assert "no prefix credit: 0 of 10" in none
    assert "no KV lookups" in peers.kv_credit_note(after, after, "p")


def test_each_worker_gets_its_own_kv_event_port_through_the_sim_drivers_flags() -> None:
    profile = fleet.SimProfile()
    flags = [fleet.worker_flags(profile, port) for port in (5560, 5561)]
    driver = get_driver("sim")
    argvs = [
        driver.argv(
            LaunchSpec(
                model_id="sim-chat", model="sim-chat", port=9000, flags=f, kv_events_endpoint="tcp://127.0.0.1:6000"
            )
        )
        for f in flags
    ]
    for argv, port in zip(argvs, (5560, 5561)):
        assert (
            argv[argv.index("--kv-events") + 1] == "tcp://127.0.0.1:6000"
        )  # the worker's own listener keeps its events
        assert argv[argv.index("--kv-events-bind") + 1] == f"tcp://127.0.0.1:{port}"
        assert argv[argv.index("--block-size") + 1] == str(profile.block_size)
    assert driver.unused_flags(LaunchSpec(model_id="m", model="m", flags=flags[0])) == []
    with pytest.raises(LaunchError, match=r"flags.kv_events_bind: '5560' is not a tcp://HOST:PORT endpoint"):
        driver.argv(LaunchSpec(model_id="m", model="m", port=9000, flags={"kv_events_bind": "5560"}))


def test_a_peer_that_cannot_install_is_reported_with_pips_reason(tmp_path: Path) -> None:
    spec = peers.PeerSpec(
        "broken", str(tmp_path / "no-such-project"), "n/a"
    )  # a local path: pip fails without any registry
    with pytest.raises(peers.PeerUnavailable) as caught:
        peers.ensure_installed(spec, tmp_path / "peers", timeout=120)
    assert "failed with exit" in str(caught.value) and "broken.install.log" in str(caught.value)
    assert not (tmp_path / "peers" / "broken" / peers.MARKER).exists()  # the next run tries again
