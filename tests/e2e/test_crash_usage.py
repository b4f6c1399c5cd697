"""A leader killed with SIGKILL under load loses no usage row: complete answers keep theirs, in-flight ones are marked.
A stream cut short (its client left, its engine died) is recorded with its prompt and the tokens streamed.

Each client request carries its own ``X-Request-Id``; after the restart the
usage stream is read to the end and compared with what the clients saw.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tests.support.opod_process import Leader, OpodProcess, opod_cli, sim_worker, usage_rows, wait_until

MODEL = "sim-slow"


def _chat(leader: Leader, request_id: str) -> bool:
    """True when the whole answer arrived."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 12}).encode()
    request = urllib.request.Request(
        leader.url + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={
            "Authorization": f"Bearer {leader.key}",
            "Content-Type": "application/json",
            "X-Request-Id": request_id,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
            return response.status == 200 and bool(answer["choices"][0]["message"]["content"])
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return False


def test_sigkill_under_load_keeps_every_answered_request_and_marks_the_rest(tmp_path: Path) -> None:
    home = tmp_path / "leader"
    leader = Leader(home, worker=False, extra=["--no-default-models"])
    worker_home = tmp_path / "worker"
    worker = sim_worker(leader, worker_home, "n_w", OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 1.0}))
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)

        answered: list[str] = []
        sent: list[str] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                request_id = f"crash-{uuid.uuid4().hex[:12]}"
                sent.append(request_id)
                if _chat(leader, request_id):
                    answered.append(request_id)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(answered) >= 40, 60, "answers to flow")
        leader.process.kill()
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert len(sent) > len(answered), "some requests must have been in flight at the kill"

        leader = Leader(home, worker=False, extra=["--no-default-models"])
        rows = usage_rows(leader)
        by_id = {r.data.request_id: r for r in rows if r.data.request_id.startswith("crash-")}
        missing = [rid for rid in answered if rid not in by_id or by_id[rid].data.outcome != "ok"]
        assert missing == [], f"{len(missing)} answered requests have no ok usage row: {missing[:5]}"
        interrupted = [r for r in by_id.values() if r.data.outcome == "interrupted"]
        assert interrupted, "requests in flight at the kill must appear as interrupted rows"
        assert all(rid in sent for rid in by_id), "no row for a request nobody sent"
        assert len({r.id for r in rows}) == len(rows), "no row twice"
        ok_rows = [r for r in by_id.values() if r.data.outcome == "ok"]
        assert all(r.data.completion_tokens > 0 and r.data.node_id == "n_w" and r.data.model == MODEL for r in ok_rows)
    finally:
        worker.stop()
        if leader.process.proc.poll() is None:
            leader.process.stop()


def _stream_until(leader: Leader, request_id: str, tokens: int) -> tuple[socket.socket, bytes]:
    """A raw streamed chat, read until ``tokens`` content deltas (or its end) arrived."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "You answer at length."},
                {"role": "user", "content": "a long answer about the sea, please"},
            ],
            "max_tokens": 1000,
            "stream": True,
        }
    ).encode()
    host, port = leader.url.removeprefix("http://").rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=30)
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: opod\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {leader.key}\r\nX-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while seen.count(b'"content":"') - seen.count(b'"content":""') < tokens and b"data: [DONE]" not in seen:
        chunk = conn.recv(65536)
        if not chunk:
            break
        seen += chunk
    return conn, seen


def _row(leader: Leader, request_id: str):
    return next((row.data for row in usage_rows(leader) if row.data.request_id == request_id), None)


def _engine_url(worker: OpodProcess) -> str:
    urls = re.findall(rf"{MODEL} serving on (http://127\.0\.0\.1:\d+)", worker.output)
    assert urls, worker.output
    return urls[-1]


def test_streams_cut_short_are_recorded_with_their_prompt_and_the_tokens_streamed(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader", worker=False, extra=["--no-default-models"])
    worker = sim_worker(leader, tmp_path / "worker", "n_cut", OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 1.0}))
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)

        # A whole answer: the engine's own count of the prompt, for comparison.
        conn, seen = _stream_until(leader, "cut-whole", 10_000)
        conn.close()
        assert b"data: [DONE]" in seen
        whole = wait_until(lambda: _row(leader, "cut-whole"), 10, "the whole answer's row")
        assert whole.outcome == "ok" and whole.prompt_tokens > 0

        # The client leaves after a few tokens.
        conn, seen = _stream_until(leader, "cut-left", 3)
        conn.close()
        got = seen.count(b'"content":"') - seen.count(b'"content":""')
        left = wait_until(lambda: _row(leader, "cut-left"), 10, "the row of the request whose client left")
        assert left.outcome == "cancelled"
        assert got <= left.completion_tokens < 1000
        assert left.prompt_tokens == whole.prompt_tokens, "the prompt is counted as the engine counts it"
        assert left.route["prompt_tokens"] == "counted"

        # The engine dies mid-stream.
        request = urllib.request.Request(
            _engine_url(worker) + "/sim/faults",
            data=json.dumps({"crash_after_tokens": 5}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
        conn, seen = _stream_until(leader, "cut-crash", 10_000)
        conn.close()
        got = seen.count(b'"content":"') - seen.count(b'"content":""')
        assert b"upstream_interrupted" in seen and got >= 1
        crashed = wait_until(lambda: _row(leader, "cut-crash"), 10, "the row of the request whose engine died")
        assert crashed.outcome == "error" and crashed.completion_tokens == got
        assert crashed.prompt_tokens > 0 and crashed.route["prompt_tokens"] in ("counted", "estimated")
    finally:
        worker.stop()
        leader.process.stop()


def test_a_stream_in_flight_when_the_leader_is_killed_is_recorded_as_far_as_it_got(tmp_path: Path) -> None:
    home = tmp_path / "leader"
    leader = Leader(home, worker=False, extra=["--no-default-models"])
    # 40 ms a token, 1,000 of them: still streaming long after the kill.
    slow = {"time_scale": 1.0, "extra": ["--itl-ms", "40", "--output-min", "1000", "--output-max", "1000"]}
    worker = sim_worker(leader, tmp_path / "worker", "n_kill", OPOD_ENGINE_FLAGS=json.dumps(slow))
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        conn, seen = _stream_until(leader, "killed-mid-stream", 20)
        assert b"data: [DONE]" not in seen, "the answer must still be streaming"
        conn.settimeout(0.1)
        deadline = time.monotonic() + 1.5  # more than a progress interval after the 20th token
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                seen += conn.recv(65536)
        leader.process.kill()
        conn.settimeout(2)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                seen += chunk
        conn.close()
        streamed = seen.count(b'"content":"') - seen.count(b'"content":""')

        leader = Leader(home, worker=False, extra=["--no-default-models"])
        row = _row(leader, "killed-mid-stream")
        assert row is not None and row.outcome == "interrupted"
        assert 20 <= row.completion_tokens <= streamed, (row.completion_tokens, streamed)
        assert row.prompt_tokens > 0 and row.node_id == "n_kill" and row.route == {"prompt_tokens": "estimated"}
    finally:
        worker.stop()
        if leader.process.proc.poll() is None:
            leader.process.stop()
