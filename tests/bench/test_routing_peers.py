"""Peers: why vllm-router's kv_aware cannot run against an engine, and a failed install reported with its reason."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from aiohttp import web

from bench.routing import peers


def _engine(sources: dict, render: bool) -> tuple[str, callable]:
    """A stand-in engine on a thread: its KV event sources and, optionally, the render endpoint."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def kv_event_sources(request: web.Request) -> web.Response:
        return web.json_response(sources)

    async def rendered(request: web.Request) -> web.Response:
        return web.json_response({"token_ids": [1, 2, 3]})

    async def setup() -> None:
        app = web.Application()
        app.router.add_get("/kv_event_sources", kv_event_sources)
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


@pytest.mark.parametrize(("sources", "render", "expected"), [
    ({}, False, ["publish no KV events", "no POST /v1/chat/completions/render"]),
    ({"0": {"endpoint": "tcp://127.0.0.1:5557"}}, True, ["send their KV events to their opod worker"]),
    ({"0": {"endpoint": "tcp://*:5557"}}, False, ["no POST /v1/chat/completions/render"]),
    ({"0": {"endpoint": "tcp://*:5557"}}, True, []),
])
def test_kv_aware_needs_events_the_router_can_subscribe_to_and_the_render_endpoint(sources: dict, render: bool, expected: list[str]) -> None:
    url, stop = _engine(sources, render)
    try:
        gap = peers.kv_aware_gap([url])
    finally:
        stop()
    if not expected:
        assert gap == ""
    for words in expected:
        assert words in gap
    if sources.get("0", {}).get("endpoint", "").startswith("tcp://*") and render:
        assert "KV events" not in gap


def test_a_peer_that_cannot_install_is_reported_with_pips_reason(tmp_path: Path) -> None:
    spec = peers.PeerSpec("broken", str(tmp_path / "no-such-project"), "n/a")  # a local path: pip fails without any registry
    with pytest.raises(peers.PeerUnavailable) as caught:
        peers.ensure_installed(spec, tmp_path / "peers", timeout=120)
    assert "failed with exit" in str(caught.value) and "broken.install.log" in str(caught.value)
    assert not (tmp_path / "peers" / "broken" / peers.MARKER).exists()  # the next run tries again
