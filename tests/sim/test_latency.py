"""The latency model as a client feels it: a full batch queues, a fuller batch decodes slower, the pace holds."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from opod.sim import SimConfig
from opod.sim.engine import Engine
from opod.sim.textgen import Plan
from tests.sim.conftest import FAST


def gauge(url: str, name: str) -> float:
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise AssertionError(name)


def timed_requests(url: str, n: int, max_tokens: int) -> list[float]:
    took = [0.0] * n
    client = httpx.Client(base_url=url)

    def one(i: int) -> None:
        start = time.perf_counter()
        r = client.post(
            "/v1/completions",
            json={"model": "sim-model", "prompt": f"request {i}", "max_tokens": max_tokens, "ignore_eos": True},
            timeout=30,
        )
        assert r.status_code == 200
        took[i] = time.perf_counter() - start

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    return took


def test_requests_beyond_max_batch_wait_and_are_counted_as_waiting(sim) -> None:
    h = sim(max_batch=1, itl_ms=10.0)
    seen = {"running": 0.0, "waiting": 0.0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen["running"] = max(seen["running"], gauge(h.url, "vllm:num_requests_running"))
            seen["waiting"] = max(seen["waiting"], gauge(h.url, "vllm:num_requests_waiting"))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    took = sorted(timed_requests(h.url, 3, 20))
    stop.set()
    watcher.join()
    assert seen == {"running": 1.0, "waiting": 2.0}
    # The last one waited for the two before it: it ended well over one answer's decode after the first did
    # (all three at once would end together). A difference, not a ratio: a slow start on a busy machine delays all.
    decode = (20 - 1) * 0.010
    assert took[2] - took[0] > 1.5 * decode, took
    assert gauge(h.url, "vllm:request_queue_time_seconds_sum") > 0.1


def test_inter_token_latency_grows_with_the_running_batch(sim) -> None:
    h = sim(itl_ms=1.0, itl_ms_per_request=8.0)
    alone = timed_requests(h.url, 1, 10)[0]
    together = sorted(timed_requests(h.url, 4, 10))
    # The median: on a busy machine the first of the four may run some steps alone before the others join.
    assert together[len(together) // 2] > 2 * alone, (alone, together)


def test_a_client_that_gives_up_while_queued_does_not_block_the_queue(sim) -> None:
    h = sim(max_batch=1, itl_ms=10.0)
    with httpx.Client(base_url=h.url) as c:
        busy = threading.Thread(
            target=lambda: c.post(
                "/v1/completions", json={"model": "sim-model", "prompt": "long", "max_tokens": 20, "ignore_eos": True}
            )
        )
        busy.start()
        time.sleep(0.05)
        try:
            c.post(
                "/v1/completions",
                json={"model": "sim-model", "prompt": "impatient", "max_tokens": 5, "stream": True},
                timeout=0.05,
            )
        except httpx.ReadTimeout:
            pass
        busy.join()
        r = c.post("/v1/completions", json={"model": "sim-model", "prompt": "next", "max_tokens": 2}, timeout=5)
        assert r.status_code == 200
        assert gauge(h.url, "vllm:num_requests_waiting") == 0


def test_tokens_keep_the_model_pace_when_the_simulator_wakes_late() -> None:
    """A decode step that woke late (another process had the CPU) is made up by the next ones, as a
    GPU engine's steps would not wait for it: six 50 ms steps take 0.3 s however late one wake is."""
    engine = Engine(SimConfig(**{**FAST, "itl_ms": 50.0}))

    async def generate() -> float:
        seq = await engine.admit([1, 2, 3], Plan(["x"] * 7, [5] * 7, "length"), 7)
        started = time.perf_counter()
        await seq.wait_first()
        time.sleep(0.2)  # noqa: ASYNC251 (the event loop held up for four steps' time, on purpose)
        for _ in range(6):
            await seq.wait_next()
        return time.perf_counter() - started

    took = asyncio.run(generate())
    assert 0.29 <= took < 0.42, took  # 0.5 s if each step waited its full time after a late wake
