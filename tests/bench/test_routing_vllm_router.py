"""vllm-router's kv_aware against two simulators: it subscribes to their bound KV-event endpoints, renders through them,
and sends a request to the engine that holds its prefix. vllm-router is installed as the benchmark installs it (once,
about 15 s); skipped, with pip's reason, only where it cannot be installed."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest

from bench.routing import peers
from opod.sim import SimConfig, running

MODEL = "sim-model"


@pytest.fixture(scope="module")
def venv() -> Path:
    try:
        return peers.ensure_installed(peers.SPECS["vllm-router"], peers.DEFAULT_DIR)
    except peers.PeerUnavailable as err:
        pytest.skip(f"vllm-router cannot be installed here: {err}")


def _chat(url: str, system: str, question: str) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_kv_aware_credits_the_engine_holding_the_prefix(tmp_path: Path, venv: Path) -> None:
    config = SimConfig(port=0, models=(MODEL,), time_scale=0.0, block_size=16, kv_events_bind="tcp://127.0.0.1:*")
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(running(config)) for _ in range(2)]
        engines = [h.url for h in sims]
        sources = {h.url: httpx.get(h.url + "/sim/state").json()["kv_events_bind"] for h in sims}
        peer = peers.start_vllm_router(venv, engines, MODEL, 16, tmp_path, policy="kv_aware", kv_sources=sources)
        stack.callback(peer.stop)
        assert (peer.label, peer.policy, peer.notes) == ("vllm-router (kv_aware)", "kv_aware", [])

        system = " ".join(f"clause{i}." for i in range(200))
        _chat(engines[1], system, "warm")  # the prefix is cached on engine 1 only
        before = peers.router_counters(peer)
        served = [httpx.get(u + "/sim/state").json()["requests"] for u in engines]
        for i in range(6):
            assert (
                _chat(peer.url, system, f"question {i}")["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 20
            )
        after_served = [httpx.get(u + "/sim/state").json()["requests"] for u in engines]
        note = peers.kv_credit_note(before, peers.router_counters(peer), "the test")

    assert "prefix credit appeared" in note, note
    assert [b - a for a, b in zip(served, after_served)] == [0, 6]
