"""The door: a real door on loopback in front of two real upstreams (an opod simulator and a recording leader)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from opod.door.routes import DoorRoutesFile
from opod.door.server import DoorError, DoorServer
from opod.http.serving import bind
from opod.sim import SimConfig, running
from tests.snapshots.helpers import Events, eventually, serving, write_atomic

REPO = Path(__file__).resolve().parents[2]
SSE = [
    b'data: {"id":"x","choices":[{"delta":{"content":"Hel"}}]}\n\n',
    b'data: {"id":"x","choices":[{"del',
    b'ta":{"content":"lo"}}]}\n\ndata: [DONE]\n\n',
]


@dataclass
class Recorder:
    """A leader double: records what reaches it and answers in fixed bytes."""

    calls: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            body = await request.body()
            self.calls.append((request.url.path, dict(request.headers), body))
            payload = json.loads(body)
            if payload["model"] == "saturated":
                return JSONResponse(
                    {"error": {"message": "No free slot", "code": "no_capacity"}},
                    status_code=503,
                    headers={"Retry-After": "3"},
                )
            if payload["model"] == "limited":
                return JSONResponse(
                    {"error": {"message": "slow down", "code": "rate_limited"}},
                    status_code=429,
                    headers={"Retry-After": "7"},
                )
            if payload["model"] == "broken":

                async def cut() -> AsyncIterator[bytes]:
                    yield SSE[0]
                    await asyncio.sleep(0.05)
                    raise RuntimeError("the leader fell over mid-stream")

                return StreamingResponse(cut(), media_type="text/event-stream")
            if payload.get("stream"):

                async def chunks() -> AsyncIterator[bytes]:
                    for i, chunk in enumerate(SSE):
                        if i:
                            await asyncio.sleep(0.4)
                        yield chunk

                return StreamingResponse(chunks(), media_type="text/event-stream")
            return JSONResponse({"object": "chat.completion", "model": payload["model"], "seen": len(body)})

        return Starlette(routes=[Route("/v1/{rest:path}", chat, methods=["POST"])])


def free_url() -> str:
    sock = bind("127.0.0.1", 0, "a closed port")
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def routes(revision: str, sim_url: str, rec_url: str, *extra: dict) -> dict:
    return {
        "revision": revision,
        "routes": [
            {"alias": "alpha", "upstream": sim_url, "model": "sim-a"},
            {"alias": "beta", "upstream": rec_url + "/", "key": "sk-route-key"},
            {"alias": "gamma", "upstream": rec_url + "/v1"},
            {"alias": "limited", "upstream": rec_url},
            {"alias": "broken", "upstream": rec_url},
            *extra,
        ],
    }


@dataclass
class Setup:
    door: str
    sim: str
    rec: str
    recorder: Recorder
    routes_path: Path
    events: Events
    server: DoorServer


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    recorder = Recorder()
    cfg = SimConfig(
        port=0, models=("sim-a",), ttft_ms=0.0, prefill_ms_per_token=0.0, itl_ms=0.0, itl_ms_per_request=0.0
    )
    with running(cfg) as sim:
        async with serving(recorder.app()) as rec_url:
            path = tmp_path / "routes.json"
            write_atomic(path, routes("r1", sim.url, rec_url, {"alias": "dead", "upstream": free_url()}))
            events = Events()
            server = DoorServer(path, ("127.0.0.1", 0), events)
            await server.start()
            stop = asyncio.Event()
            task = asyncio.create_task(server.serve(stop))
            try:
                yield Setup(f"http://127.0.0.1:{server.port}", sim.url, rec_url, recorder, path, events, server)
            finally:
                stop.set()
                await task


async def test_models_lists_the_aliases(setup: Setup) -> None:
    async with httpx.AsyncClient(base_url=setup.door) as client:
        resp = await client.get("/v1/models")
        assert resp.status_code == 200 and resp.headers["X-Request-Id"]
        assert [m["id"] for m in resp.json()["data"]] == ["alpha", "beta", "broken", "dead", "gamma", "limited"]
        assert (await client.get("/v1/models/beta")).json()["id"] == "beta"
        missing = await client.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert (await client.get("/readyz")).json() == {
            "ready": True,
            "revision": "r1",
            "models": ["alpha", "beta", "broken", "dead", "gamma", "limited"],
        }
        # Every answer carries a request id, even those no route wrote.
        for method, path in [
            ("GET", "/healthz"),
            ("GET", "/elsewhere"),
            ("DELETE", "/v1/chat/completions"),
            ("PUT", "/healthz"),
        ]:
            resp = await client.request(method, path, headers={"X-Request-Id": "mine-1"})
            assert resp.headers["X-Request-Id"] == "mine-1", (method, path)
            if path != "/healthz" or method != "GET":
                assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


async def test_an_openai_client_talks_to_a_simulator_through_the_door(setup: Setup) -> None:
    client = openai.AsyncOpenAI(base_url=setup.door + "/v1", api_key="sk-client")
    try:
        answer = await client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert answer.model == "sim-a" and answer.choices[0].message.content
        stream = await client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        assert pieces
    finally:
        await client.close()


async def test_bodies_keys_and_request_ids_reach_the_leader_as_the_route_says(setup: Setup) -> None:
    raw = b'{"model":  "gamma", "messages": [],   "extra": {"kept": true}}'
    async with httpx.AsyncClient(base_url=setup.door) as client:
        resp = await client.post(
            "/v1/chat/completions?trace=1",
            content=raw,
            headers={
                "Authorization": "Bearer sk-client",
                "X-Request-Id": "client-id-1",
                "Content-Type": "application/json",
            },
        )
        assert resp.status_code == 200 and resp.headers["X-Request-Id"] == "client-id-1"
        path, headers, body = setup.recorder.calls[-1]
        assert body == raw  # no rewrite asked: byte for byte
        assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer sk-client"
        assert headers["x-request-id"] == "client-id-1"

        resp = await client.post(
            "/v1/embeddings", json={"model": "beta", "input": "x"}, headers={"Authorization": "Bearer sk-client"}
        )
        assert resp.status_code == 200 and resp.headers["X-Request-Id"].startswith("req_")
        path, headers, body = setup.recorder.calls[-1]
        assert path == "/v1/embeddings" and headers["authorization"] == "Bearer sk-route-key"
        assert headers["x-request-id"] == resp.headers["X-Request-Id"]


async def test_a_stream_passes_byte_for_byte_as_it_comes(setup: Setup) -> None:
    async with httpx.AsyncClient(base_url=setup.door) as client:
        start = time.monotonic()
        async with client.stream("POST", "/v1/chat/completions", json={"model": "gamma", "stream": True}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            got = b""
            first_at = None
            async for chunk in resp.aiter_raw():
                first_at = first_at or time.monotonic() - start
                got += chunk
        total = time.monotonic() - start
        assert got == b"".join(SSE)
        # The upstream spends 0.8 s between its first and last chunk: the first reached us well before the end.
        assert first_at is not None and first_at < total - 0.5


async def test_a_stream_cut_by_the_leader_ends_with_an_error_event(setup: Setup) -> None:
    async with httpx.AsyncClient(base_url=setup.door) as client:
        async with client.stream("POST", "/v1/chat/completions", json={"model": "broken", "stream": True}) as resp:
            got = b"".join([chunk async for chunk in resp.aiter_raw()])
    assert got.startswith(SSE[0])
    error = json.loads(got[len(SSE[0]) :].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_interrupted" and "'broken'" in error["message"]


async def test_unknown_model_is_404_and_an_unreachable_leader_is_503(setup: Setup) -> None:
    async with httpx.AsyncClient(base_url=setup.door) as client:
        resp = await client.post("/v1/chat/completions", json={"model": "omega", "messages": []})
        assert resp.status_code == 404 and resp.headers["X-Request-Id"]
        error = resp.json()["error"]
        assert (
            error["code"] == "model_not_found"
            and error["type"] == "invalid_request_error"
            and error["param"] == "model"
        )
        assert "alpha, beta, broken, dead, gamma, limited" in error["message"]

        resp = await client.post("/v1/chat/completions", json={"model": "dead", "messages": []})
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "5" and resp.headers["X-Request-Id"]
        assert "The leader serving 'dead'" in resp.json()["error"]["message"]

        resp = await client.post("/v1/chat/completions", json={"model": "limited", "messages": []})
        assert resp.status_code == 429 and resp.headers["Retry-After"] == "7"  # the leader's own answer passes on
        assert resp.json()["error"]["code"] == "rate_limited" and resp.headers["X-Request-Id"]

        resp = await client.post("/v1/chat/completions", content=b"not json")
        assert resp.status_code == 400 and resp.headers["X-Request-Id"]
        resp = await client.post("/v1/chat/completions", json={"messages": []})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "model"


async def test_an_alias_listed_twice_fails_over_to_its_next_leader(setup: Setup) -> None:
    write_atomic(
        setup.routes_path,
        routes(
            "r2",
            setup.sim,
            setup.rec,
            {"alias": "steady", "upstream": free_url()},
            {"alias": "steady", "upstream": setup.rec},
            {"alias": "saturated", "upstream": setup.rec},
            {"alias": "saturated", "upstream": setup.sim, "model": "sim-a"},
            {"alias": "full", "upstream": setup.rec, "model": "saturated"},
        ),
    )
    await eventually(lambda: setup.server.routes.revision == "r2")
    async with httpx.AsyncClient(base_url=setup.door) as client:
        resp = await client.post("/v1/chat/completions", json={"model": "steady", "messages": []})
        assert resp.status_code == 200 and resp.json()["model"] == "steady", (
            "the unreachable first leader is passed over"
        )
        resp = await client.post(
            "/v1/chat/completions",
            json={"model": "saturated", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert resp.status_code == 200 and resp.json()["model"] == "sim-a", (
            "a 503 from the first leader hands over to the next"
        )
        resp = await client.post("/v1/chat/completions", json={"model": "full", "messages": []})
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "3", (
            "with no leader left the last 503 passes on"
        )
        assert resp.json()["error"]["code"] == "no_capacity"
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]].count("steady") == 1


async def test_the_routes_file_applies_whole_or_not_at_all(setup: Setup) -> None:
    async with httpx.AsyncClient(base_url=setup.door) as client:
        write_atomic(setup.routes_path, routes("r2", setup.sim, setup.rec, {"alias": "delta", "upstream": setup.rec}))

        async def delta_served() -> bool:
            return (await client.post("/v1/chat/completions", json={"model": "delta"})).status_code == 200

        assert await eventually(delta_served) < 2.0
        bad_files = [
            (
                routes("r3", setup.sim, setup.rec, {"alias": "beta", "upstream": setup.rec + "/v1"}),
                f"routes[5] (alias 'beta').upstream: {setup.rec} already serves this alias (routes[1]); list each leader once per alias",
            ),
            (
                routes("r3", setup.sim, setup.rec, {"alias": "eps", "upstream": ""}),
                "routes[5] (alias 'eps').upstream: empty",
            ),
            (
                routes("r3", setup.sim, setup.rec, {"alias": "eps", "upstream": "leader:8080"}),
                "routes[5] (alias 'eps').upstream: 'leader:8080' is not an http(s) URL",
            ),
            (routes("r3", setup.sim, setup.rec, {"alias": "", "upstream": setup.rec}), "routes[5].alias"),
        ]
        for content, message in bad_files:
            count = len(setup.events.of("routes.rejected"))
            write_atomic(setup.routes_path, content)
            await eventually(lambda count=count: len(setup.events.of("routes.rejected")) > count)
            assert message in setup.events.of("routes.rejected")[-1]["reason"]
            assert setup.events.of("routes.rejected")[-1]["kept_revision"] == "r2"
            assert await delta_served()  # the last good table still routes
            assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [
                "alpha",
                "beta",
                "broken",
                "delta",
                "gamma",
                "limited",
            ]
    assert [e["revision"] for e in setup.events.of("routes.updated")] == ["r1", "r2"]


async def test_a_door_will_not_start_without_a_good_routes_file(tmp_path: Path) -> None:
    with pytest.raises(DoorError, match="does not exist; write it first"):
        await DoorServer(tmp_path / "none.json", ("127.0.0.1", 0)).start()
    path = tmp_path / "routes.json"
    write_atomic(
        path,
        {
            "revision": "1",
            "routes": [{"alias": "a", "upstream": "http://x:1"}, {"alias": "a", "upstream": "http://x:1/v1"}],
        },
    )
    with pytest.raises(DoorError, match=r"routes\[1\] \(alias 'a'\).upstream: http://x:1 already serves this alias"):
        await DoorServer(path, ("127.0.0.1", 0)).start()


def test_route_targets_join_paths_and_keep_names() -> None:
    holder = DoorRoutesFile()
    holder.apply(
        holder.parse(
            json.dumps(
                {
                    "revision": "x",
                    "routes": [
                        {"alias": "a", "upstream": "https://leader.example:8443/v1/"},
                        {"alias": "b", "upstream": "http://10.0.0.2:8080/base", "model": "qwen3-8b", "key": "sk-b"},
                    ],
                }
            ).encode()
        )
    )
    [a], [b] = holder.lookup("a"), holder.lookup("b")
    assert (a.base, a.model, a.key, a.rewrites_model) == ("https://leader.example:8443", "a", "", False)
    assert (b.base, b.model, b.key, b.rewrites_model) == ("http://10.0.0.2:8080/base", "qwen3-8b", "sk-b", True)
    assert holder.lookup("c") == ()


def test_cli_run_serves_until_ctrl_c(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    write_atomic(path, {"revision": "7", "routes": [{"alias": "a", "upstream": "http://127.0.0.1:1"}]})
    port = int(free_url().rsplit(":", 1)[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1")
    code = as_command(f"run({str(path)!r}, '127.0.0.1:{port}')")
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        text = "".join(lines)
        assert f"door: OpenAI API on http://127.0.0.1:{port}/v1 for 1 model(s)" in text, text
        assert "revision '7'" in text
        data = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert [m["id"] for m in data] == ["a"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0 and "door stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def as_command(call: str) -> str:
    """``call`` inside a typer command, as ``opod up --role door`` will run it."""
    return f"import typer\nfrom opod.cli.door import run\ntyper.run(lambda: {call})"


def test_cli_run_explains_a_missing_routes_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPOD_")}
    env.update(COLUMNS="300", NO_COLOR="1")
    code = as_command(f"run({str(tmp_path / 'nope.json')!r}, '127.0.0.1:0')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=30)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "does not exist; write it first" in result.stderr
    result = subprocess.run(
        [sys.executable, "-c", as_command("run(None)")], capture_output=True, text=True, cwd=REPO, env=env, timeout=30
    )
    assert result.returncode == 1 and "give --routes FILE (or set OPOD_DOOR_ROUTES)" in result.stderr
