"""The load generator against a tiny local server: TTFT from the first text chunk, tokens from usage, errors kept."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from bench.routing.load import Target, closed_loop, cpu_seconds, cpu_wait_seconds, open_loop
from opod.worker import processes
from tests.bench.chat_server import serve_chat


async def _serve() -> tuple[web.AppRunner, str, list[str]]:
    seen: list[str] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Content-Type", ""))
        body = await request.json()
        if body.get("fail"):
            return web.json_response({"error": "busy"}, status=503)
        if not body.get("stream"):
            timing = {"Server-Timing": "opod;dur=0.250, upstream;dur=3.5"} if body.get("timed") else {}
            return web.json_response(
                {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 2}}, headers=timing
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
        await asyncio.sleep(0.05)
        for word in ("a", "b", "c"):
            await resp.write(b'data: {"choices":[{"delta":{"content":"' + word.encode() + b'"}}]}\n\n')
            await asyncio.sleep(0.01)
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    runner, base = await serve_chat(chat)
    return runner, base, seen


def test_streamed_answers_give_ttft_gaps_and_tokens_and_refusals_are_errors() -> None:
    async def go():
        runner, base, seen = await _serve()
        try:
            ok = json.dumps({"stream": True}).encode()
            bad = json.dumps({"stream": True, "fail": True}).encode()
            phase = await open_loop(Target("t", (base,)), [(0.0, ok), (0.01, bad), (0.02, ok)], stream=True, drain=5)
        finally:
            await runner.cleanup()
        return phase, seen

    phase, seen = asyncio.run(go())
    assert set(seen) == {"application/json"}  # routers refuse a body sent as application/octet-stream
    good = [s for s in phase.samples if s.ok]
    assert len(good) == 2 and phase.sent == 3
    for s in good:
        assert 0.04 < s.ttft < 1.0  # the role chunk does not count as the first token
        assert s.tokens == 3 and len(s.gaps) == 2
    failed = next(s for s in phase.samples if not s.ok)
    assert failed.status == 503 and failed.error.startswith("HTTP 503")


def test_a_closed_loop_counts_completions_in_its_window() -> None:
    async def go():
        runner, base, _ = await _serve()
        try:
            return await closed_loop(
                Target("t", (base,)), json.dumps({}).encode(), concurrency=4, seconds=0.5, warmup=0.1
            )
        finally:
            await runner.cleanup()

    phase = asyncio.run(go())
    assert phase.samples and all(s.ok and s.tokens == 2 for s in phase.samples)
    assert phase.seconds == 0.5


def test_a_routers_own_time_is_read_from_its_server_timing_header() -> None:
    async def go():
        runner, base, _ = await _serve()
        try:
            timed, plain = json.dumps({"timed": True}).encode(), json.dumps({}).encode()
            return await open_loop(Target("t", (base,)), [(0.0, timed), (0.01, plain)], stream=False, drain=5)
        finally:
            await runner.cleanup()

    phase = asyncio.run(go())
    own = {s.own for s in phase.samples}
    assert all(s.ok for s in phase.samples) and own == {0.00025, None}  # milliseconds on the wire, seconds here


def test_the_generators_collector_is_paused_while_it_measures_and_restored_after() -> None:
    # A full collection in the generator stalls every request in flight: noise in whichever path's window it falls.
    async def go():
        enabled: list[bool] = []

        async def chat(request: web.Request) -> web.Response:
            enabled.append(gc.isenabled())  # the server shares the generator's process here
            return web.json_response({"choices": [], "usage": {"completion_tokens": 1}})

        runner, base = await serve_chat(chat)
        try:
            body = json.dumps({}).encode()
            await open_loop(Target("t", (base,)), [(0.0, body), (0.01, body)], stream=False, drain=5)
            await closed_loop(Target("t", (base,)), body, concurrency=2, seconds=0.2, warmup=0.05)
        finally:
            await runner.cleanup()
        return enabled

    frozen_before = gc.get_freeze_count()
    enabled = asyncio.run(go())
    assert len(enabled) >= 3 and not any(enabled)
    assert gc.isenabled() and gc.get_freeze_count() == frozen_before


BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"


def test_a_routers_cpu_time_counts_its_process_group_its_own_process_and_its_children() -> None:
    # The parent burns 0.4 s of CPU in a session of its own, starts a child that burns 0.4 s, then both wait to be read.
    child = BURN + "print('burnt', flush=True)\ntime.sleep(60)\n"
    parent = (
        f"{BURN}import subprocess, sys\n"
        f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True)\n"
        "print(c.pid, c.stdout.readline().strip(), flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child_pid, said = proc.stdout.readline().split()  # type: ignore[union-attr]
        assert said == "burnt"
        family, alone = cpu_seconds(proc.pid), processes.cpu_seconds(int(child_pid))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert 0.35 <= alone < 0.7
    assert family >= alone + 0.35


def test_a_routers_wait_for_a_core_counts_the_time_its_threads_were_ready_but_not_running() -> None:
    # Three processes of one group, all held to one core, each burning 0.4 s of CPU: while one runs the other two
    # wait, so between them they wait about twice as long as they run (a reading of their CPU instead would not).
    if not Path(f"/proc/{os.getpid()}/schedstat").exists():
        pytest.skip("this kernel has no /proc/PID/schedstat (run-queue delays are not kept)")
    core = min(os.sched_getaffinity(0))
    pinned = f"import os, time\nos.sched_setaffinity(0, {{{core}}})\n{BURN}"
    child = pinned + "print('burnt', flush=True)\ntime.sleep(60)\n"
    parent = (
        "import subprocess, sys\n"
        f"cs = [subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE, text=True) for _ in '12']\n"
        f"{pinned}print(*[c.stdout.readline().strip() for c in cs], flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said = proc.stdout.readline().split()  # type: ignore[union-attr]
        assert said == ["burnt", "burnt"]
        waited, spent = cpu_wait_seconds(proc.pid), cpu_seconds(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert spent >= 1.1
    assert 1.3 * spent <= waited < 10.0, (waited, spent)
