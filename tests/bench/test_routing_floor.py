"""The bench's bare relay (its yardstick path): answers pass through whole, streams stream, engines take turns."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from bench.routing import peers
from bench.routing.load import Target, open_loop
from tests.bench.chat_server import serve_chat


async def _engine(name: str, seen: list[str], left: asyncio.Event) -> tuple[web.AppRunner, str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(name)
        if not body.get("stream"):
            return web.json_response({"engine": name, "echo": body.get("messages"), "usage": {"completion_tokens": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for word in body.get("words", ["a", "b", "c"]):
                await asyncio.sleep(0.03)
                await resp.write(b'data: {"choices":[{"delta":{"content":"' + word.encode() + b'"}}]}\n\n')
            await resp.write(
                b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
            )
        except ConnectionError:
            left.set()
        return resp

    return await serve_chat(chat)


async def _fleet(tmp_path):
    seen: list[str] = []
    left = asyncio.Event()
    engines = [await _engine(name, seen, left) for name in ("e1", "e2")]
    relay = await asyncio.to_thread(peers.start_floor, [base for _, base in engines], "m", tmp_path)
    seen.clear()  # the readiness request
    return engines, relay, seen, left


async def test_answers_pass_through_and_engines_take_turns(tmp_path) -> None:
    engines, relay, seen, _ = await _fleet(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            answers = []
            for i in range(4):
                async with session.post(relay.url + "/v1/chat/completions", json={"messages": [f"hi {i}"]}) as resp:
                    assert resp.status == 200
                    answers.append(await resp.json())
        assert [a["echo"] for a in answers] == [[f"hi {i}"] for i in range(4)]
        assert sorted(seen) == ["e1", "e1", "e2", "e2"] and seen[0] != seen[1]

        phase = await open_loop(
            Target("floor", (relay.url,)), [(0.0, json.dumps({"stream": True}).encode())] * 2, stream=True, drain=5
        )
        for sample in phase.samples:
            assert sample.ok and sample.tokens == 3
            # Each word left the engine 30 ms after the last; a relay that held the answer back would bunch them.
            assert len(sample.gaps) == 2 and min(sample.gaps) > 0.015
    finally:
        relay.stop()
        for runner, _ in engines:
            await runner.cleanup()


async def test_a_client_that_leaves_mid_stream_ends_the_engine_side_too(tmp_path) -> None:
    engines, relay, _, left = await _fleet(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            body = {"stream": True, "words": ["w"] * 200}
            async with session.post(relay.url + "/v1/chat/completions", json=body) as resp:
                assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: ")
                resp.close()
        await asyncio.wait_for(left.wait(), 5)
    finally:
        relay.stop()
        for runner, _ in engines:
            await runner.cleanup()
