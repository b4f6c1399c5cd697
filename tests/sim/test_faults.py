"""Failure injection: errors in the dialect's shape, stalls, crashes, and changing them on a running simulator."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from opod.sim.faults import CRASH_EXIT_CODE


def chat(url: str, **extra: object) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra},
        timeout=10,
    )


def test_fail_next_makes_the_next_requests_fail_with_a_vllm_shaped_500(sim) -> None:
    h = sim()
    assert httpx.post(h.url + "/sim/faults", json={"fail_next": 2}).json()["fail_next"] == 2
    for _ in range(2):
        r = chat(h.url)
        assert r.status_code == 500
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == 500 and "injected" in err["message"]
    assert chat(h.url).status_code == 200
    with openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0) as c:
        httpx.post(h.url + "/sim/faults", json={"fail_next": 1, "fail_status": 503})
        with pytest.raises(openai.InternalServerError) as raised:
            c.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}])
        assert raised.value.status_code == 503


def test_injected_errors_use_each_dialects_shape(sim) -> None:
    llama = sim(dialect="llamacpp", fail_rate=1.0)
    assert chat(llama.url).json() == {
        "error": {
            "code": 500,
            "message": "injected failure (opod sim fault injection, status 500)",
            "type": "server_error",
        }
    }
    ollama = sim(dialect="ollama", fail_rate=1.0)
    r = httpx.post(ollama.url + "/api/generate", json={"model": "sim-model", "prompt": "hi", "stream": False})
    assert r.status_code == 500 and isinstance(r.json()["error"], str)


def test_the_fail_rate_is_drawn_from_the_seed(sim) -> None:
    def pattern(seed: int) -> list[int]:
        h = sim(seed=seed, fail_rate=0.5)
        return [chat(h.url).status_code for _ in range(16)]

    first = pattern(3)
    assert first == pattern(3)
    assert {200, 500} == set(first)
    assert first != pattern(4)


def test_a_stall_delays_the_first_token_or_the_middle_of_the_stream(sim) -> None:
    h = sim()
    start = time.perf_counter()
    chat(h.url)
    quick = time.perf_counter() - start
    httpx.post(h.url + "/sim/faults", json={"stall_next": 1, "stall_ms": 300, "stall_at": "first"})
    start = time.perf_counter()
    chat(h.url)
    assert time.perf_counter() - start >= 0.3 > quick
    httpx.post(h.url + "/sim/faults", json={"stall_next": 1, "stall_at": "mid"})
    gaps = []
    with httpx.stream(
        "POST",
        h.url + "/v1/chat/completions",
        json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True},
    ) as r:
        last = time.perf_counter()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
    # A 300 ms stall; the gap seen by the client may be a hair shorter (the chunk before it can arrive late).
    assert max(gaps[2:]) >= 0.28 and gaps[1] < 0.28  # the role chunk and the first token came at once


def test_bad_fault_settings_are_refused_by_name(sim) -> None:
    h = sim()
    r = httpx.post(h.url + "/sim/faults", json={"fail_rate": 2})
    assert r.status_code == 400 and "fail_rate" in r.json()["error"]["message"]
    r = httpx.post(h.url + "/sim/faults", json={"explode": True})
    assert r.status_code == 400 and "explode" in r.json()["error"]["message"]
    assert httpx.get(h.url + "/sim/faults").json()["fail_rate"] == 0.0


def test_crash_after_n_requests_ends_the_process(sim_process) -> None:
    p = sim_process("--crash-after", "2", "--time-scale", "0")
    assert chat(p.url).status_code == 200
    assert chat(p.url).status_code == 200
    with pytest.raises(httpx.TransportError):
        chat(p.url)
    assert p.proc.wait(10) == CRASH_EXIT_CODE
    assert "crash_after=2" in p.proc.stderr.read()


def test_crash_mid_stream_after_k_tokens_set_at_run_time(sim_process) -> None:
    p = sim_process("--time-scale", "0", "--output-min", "20", "--output-max", "20")
    assert chat(p.url).status_code == 200
    httpx.post(p.url + "/sim/faults", json={"crash_after_tokens": 3})
    tokens = 0
    with pytest.raises(httpx.TransportError):
        with httpx.stream(
            "POST",
            p.url + "/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ) as r:
            for line in r.iter_lines():
                if '"content":"' in line and '"role"' not in line:
                    tokens += 1
    assert tokens == 3
    assert p.proc.wait(10) == CRASH_EXIT_CODE
