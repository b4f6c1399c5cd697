"""Stopping a node gracefully: the streams in flight finish, new requests are told to go elsewhere, a second Ctrl-C stops at once.

``opod up`` runs its local worker on the simulator, slowed so an answer takes seconds; the
signals are sent to the process as a supervisor (systemd, Kubernetes, a terminal) sends them.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.support.opod_process import Leader, OpodProcess, http, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
ITL_MS = 40
ANSWER_TOKENS = 60
"""A stream of 60 tokens 40 ms apart: about 2.4 s, long enough to stop the node in the middle of it."""


def slow_sim(tokens: int = ANSWER_TOKENS) -> str:
    return json.dumps({"extra": ["--itl-ms", str(ITL_MS), "--output-min", str(tokens), "--output-max", str(tokens)]})


def up_with_a_sim(home: Path, tokens: int = ANSWER_TOKENS, **env: str) -> Leader:
    leader = Leader(
        home, extra=["--no-default-models", "--engine", "sim"], env={"OPOD_ENGINE_FLAGS": slow_sim(tokens), **env}
    )
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
    leader.wait_served(MODEL, timeout=90)
    return leader


class Stream:
    """A streamed chat answer read on its own thread, raw, as the bytes arrive."""

    def __init__(self, leader: Leader, request_id: str = "", *, model: str = MODEL, **extra: object) -> None:
        body = json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": "a long answer, please"}],
                "max_tokens": 1000,
                "stream": True,
                **extra,
            }
        ).encode()
        host, port = leader.url.removeprefix("http://").rsplit(":", 1)
        self.conn = socket.create_connection((host, int(port)), timeout=30)
        rid = f"X-Request-Id: {request_id}\r\n" if request_id else ""
        self.conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: opod\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {leader.key}\r\n{rid}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self.seen = b""
        self.ended = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while chunk := self.conn.recv(65536):
                self.seen += chunk
                if b"data: [DONE]" in self.seen or self.seen.endswith(b"\r\n0\r\n\r\n"):
                    break  # the answer's end, or its chunked body's (the connection itself is kept alive)
        except OSError:
            pass
        finally:
            self.ended.set()

    @property
    def tokens(self) -> int:
        return self.seen.count(b'"content":"') - self.seen.count(b'"content":""')

    def finish_reasons(self) -> list[str]:
        reasons = []
        for line in self.seen.split(b"\n"):
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                reasons += [c["finish_reason"] for c in event.get("choices") or [] if c.get("finish_reason")]
        return reasons

    def close(self) -> None:
        self.conn.close()


def chat_once(leader: Leader) -> tuple[int, dict, object]:
    return http(
        "POST",
        leader.url + "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        key=leader.key,
        timeout=10,
    )


def test_a_stream_in_flight_at_sigterm_completes_and_new_requests_get_503_until_the_node_exits(tmp_path: Path) -> None:
    leader = up_with_a_sim(tmp_path / "home")
    proc = leader.process.proc
    stream = Stream(leader)
    try:
        wait_until(lambda: stream.tokens >= 3 or stream.ended.is_set(), 30, "the stream's first tokens")
        assert stream.seen.startswith(b"HTTP/1.1 200 ") and not stream.ended.is_set()
        proc.send_signal(signal.SIGTERM)

        # A request sent while the node stops is refused, saying why and when to come back.
        refused = wait_until(
            lambda: (answer := chat_once(leader))[0] == 503 and answer, 5, "a new request to be refused"
        )
        status, headers, body = refused
        assert int(headers["retry-after"]) >= 1
        assert body["error"]["code"] == "stopping" and "not taking new requests" in body["error"]["message"]
        assert proc.poll() is None, "the node must wait for the stream in flight"

        assert stream.ended.wait(30), f"the stream did not end; output:\n{leader.process.output}"
        assert stream.finish_reasons() == ["length"] or stream.finish_reasons() == ["stop"], stream.seen[-400:]
        assert b"data: [DONE]" in stream.seen and b'"error"' not in stream.seen
        assert stream.tokens == ANSWER_TOKENS
        assert proc.wait(timeout=30) == 0
    finally:
        stream.close()
        if proc.poll() is None:
            leader.process.stop()
    output = leader.process.output
    # The stream, and perhaps a request that arrived before the signal was handled.
    assert re.search(r"stopping: \d+ requests? in flight, waiting up to 30 s", output), output
    assert "the requests in flight finished" in output, output


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    leader = up_with_a_sim(tmp_path / "home", tokens=1000)  # 40 s of answer: only a hurried stop ends it soon
    proc = leader.process.proc
    stream = Stream(leader)
    try:
        wait_until(lambda: stream.tokens >= 3, 30, "the stream's first tokens")
        proc.send_signal(signal.SIGINT)
        leader.process.wait_for_line("stopping: 1 request in flight", timeout=10)
        time.sleep(0.5)
        assert proc.poll() is None, "the first Ctrl-C waits for the stream"
        second = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
        assert time.monotonic() - second < 8, "a second Ctrl-C must not wait out the grace or the engine's SIGTERM"
        assert stream.ended.wait(5)
    finally:
        stream.close()
        if proc.poll() is None:
            leader.process.stop()
    assert "stopping now" in leader.process.output


def test_a_stream_longer_than_the_stop_grace_is_cut_when_the_grace_ends(tmp_path: Path) -> None:
    grace = 3
    # 40 s of answer: the stream outlives the grace, and the engine (like llama-server) finishes it on SIGTERM.
    leader = up_with_a_sim(tmp_path / "home", tokens=1000, OPOD_STOP_GRACE=str(grace))
    proc = leader.process.proc
    stream = Stream(leader)
    try:
        wait_until(lambda: stream.tokens >= 3, 30, "the stream's first tokens")
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert stream.ended.wait(30), f"the stream did not end; output:\n{leader.process.output}"
        took = time.monotonic() - signalled
        assert grace - 0.5 < took < grace + 3, f"the stream was cut {took:.1f} s after SIGTERM, the grace is {grace} s"
        assert proc.wait(timeout=15) == 0
    finally:
        stream.close()
        if proc.poll() is None:
            leader.process.stop()
    assert f"still in flight after {grace} s are cut off" in leader.process.output, leader.process.output


def test_a_stopping_worker_lets_its_stream_finish_before_its_engine_stops(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader", worker=False, extra=["--no-default-models"])
    # Long enough that the stream still runs when the stopping worker first asks its engine, however slow the machine.
    tokens = 150
    worker: OpodProcess = sim_worker(leader, tmp_path / "worker", "n_stopping", OPOD_ENGINE_FLAGS=slow_sim(tokens))
    stream: Stream | None = None
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        stream = Stream(leader)
        wait_until(lambda: stream.tokens >= 3, 30, "the stream's first tokens")
        worker.proc.send_signal(signal.SIGTERM)
        assert stream.ended.wait(30), f"the stream did not end; worker output:\n{worker.output}"
        assert b"data: [DONE]" in stream.seen and b'"error"' not in stream.seen and stream.tokens == tokens
        assert worker.proc.wait(timeout=30) == 0
        # The leader heard the goodbye: nothing is routed to the stopped worker.
        wait_until(lambda: MODEL not in leader.served(), 10, "the model to leave the stopped worker")
    finally:
        if stream is not None:
            stream.close()
        if worker.proc.poll() is None:
            worker.stop()
        leader.process.stop()
    assert "cut off" not in worker.output, worker.output


def test_a_stopping_worker_cuts_a_stream_longer_than_its_grace_when_the_grace_ends(tmp_path: Path) -> None:
    grace = 3
    leader = Leader(tmp_path / "leader", worker=False, extra=["--no-default-models"])
    worker = sim_worker(
        leader, tmp_path / "worker", "n_cut", OPOD_ENGINE_FLAGS=slow_sim(1000), OPOD_STOP_GRACE=str(grace)
    )
    stream: Stream | None = None
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        stream = Stream(leader)
        wait_until(lambda: stream.tokens >= 3, 30, "the stream's first tokens")
        worker.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert stream.ended.wait(30), f"the stream did not end; worker output:\n{worker.output}"
        took = time.monotonic() - signalled
        assert grace - 0.5 < took < grace + 3, (
            f"the stream was cut {took:.1f} s after SIGTERM, the grace is {grace} s; worker output:\n{worker.output}"
        )
        assert worker.proc.wait(timeout=15) == 0
    finally:
        if stream is not None:
            stream.close()
        if worker.proc.poll() is None:
            worker.stop()
        leader.process.stop()
    assert "still in flight are cut off" in worker.output, worker.output


def test_readyz_says_not_ready_while_the_node_stops(tmp_path: Path) -> None:
    leader = up_with_a_sim(tmp_path / "home")
    proc = leader.process.proc
    stream = Stream(leader)
    try:
        wait_until(lambda: stream.tokens >= 3, 30, "the stream's first tokens")
        assert http("GET", leader.url + "/readyz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        status, headers, body = wait_until(
            lambda: (probe := http("GET", leader.url + "/readyz", timeout=5))[0] == 503 and probe,
            5,
            "/readyz to say not ready",
        )
        assert body["ready"] is False and "stopping" in body["reason"] and headers["retry-after"]
        assert not stream.ended.is_set(), "not ready while the stream in flight still runs"
        assert stream.ended.wait(30) and b"data: [DONE]" in stream.seen
    finally:
        stream.close()
        if proc.poll() is None:
            leader.process.stop()


def test_a_drained_worker_finishes_its_stream_and_takes_no_new_one(tmp_path: Path) -> None:
    leader = up_with_a_sim(tmp_path / "home")
    stream = Stream(leader)
    try:
        wait_until(lambda: stream.tokens >= 3, 30, "the stream's first tokens")
        nodes = http("GET", leader.url + "/admin/v1/nodes", key=leader.key)[2]
        (node,) = [n["id"] for n in nodes]
        status, _, _ = http("POST", f"{leader.url}/admin/v1/nodes/{node}/drain", key=leader.key)
        assert status == 200
        refused = chat_once(leader)
        assert refused[0] == 503 and refused[1]["retry-after"], refused
        assert stream.ended.wait(30) and b"data: [DONE]" in stream.seen and b'"error"' not in stream.seen
        assert stream.tokens == ANSWER_TOKENS
    finally:
        stream.close()
        leader.process.stop()


@pytest.mark.engine
def test_a_stream_on_llama_server_in_flight_at_sigterm_completes(tmp_path: Path) -> None:
    """The real engine: llama-server would ignore SIGTERM mid-answer; the node waits for the answer instead."""
    chat = "smollm2-135m-instruct"
    # A grace the answer fits in on a slow, shared machine: one still running when the grace ends is cut off.
    leader = Leader(tmp_path / "home", env={"OPOD_STOP_GRACE": "120"})
    leader.wait_served(chat, timeout=150)
    proc = leader.process.proc
    stream = Stream(leader, model=chat, max_tokens=200, ignore_eos=True)
    try:
        wait_until(lambda: stream.tokens >= 3, 60, "the stream's first tokens")
        proc.send_signal(signal.SIGTERM)
        # Within the grace: three test processes share two cores in CI, and the model may answer slowly then.
        assert stream.ended.wait(110), f"the stream did not end; output:\n{leader.process.output}"
        assert (
            stream.finish_reasons() == ["length"] and b"data: [DONE]" in stream.seen and b'"error"' not in stream.seen
        )
        assert proc.wait(timeout=30) == 0
    finally:
        stream.close()
        if proc.poll() is None:
            leader.process.stop()
    assert "the requests in flight finished" in leader.process.output
