"""``build_app`` is a plain ASGI app: it serves in-process, without a socket."""

from __future__ import annotations

import httpx

from opod.sim import SimConfig, build_app


async def test_build_app_serves_chat_in_process() -> None:
    app = build_app(SimConfig(time_scale=0, models=("m",)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
        assert (await c.get("/sim/state")).json()["requests"] == 1
