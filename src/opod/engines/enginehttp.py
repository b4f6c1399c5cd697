"""Small JSON calls to an engine, with one error that says which engine and call failed."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from opod.engines.errors import EngineCallError

_TIMEOUT = aiohttp.ClientTimeout(total=10)


async def call_text(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    engine: str,
    what: str,
    body: Any = None,
    params: dict[str, str] | None = None,
    timeout: aiohttp.ClientTimeout = _TIMEOUT,
) -> str:
    """The answer's text; :class:`EngineCallError` (with the engine's status) when it is an error or none came."""
    try:
        async with session.request(method, url, json=body, params=params, timeout=timeout) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise EngineCallError(
                    engine, what, f"HTTP {resp.status} from {url}: {text[:300]}", status=resp.status, answer=text
                )
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise EngineCallError(engine, what, f"no answer from {url} ({type(err).__name__}: {err})") from err
    return text


async def call_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    engine: str,
    what: str,
    body: Any = None,
    params: dict[str, str] | None = None,
    timeout: aiohttp.ClientTimeout = _TIMEOUT,
) -> Any:
    """The decoded JSON answer (``None`` for an empty body); :class:`EngineCallError` otherwise."""
    text = await call_text(session, method, url, engine=engine, what=what, body=body, params=params, timeout=timeout)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as err:
        raise EngineCallError(engine, what, f"{url} answered something that is not JSON: {text[:200]!r}") from err


async def try_json(session: aiohttp.ClientSession, url: str, *, timeout: float = 3) -> Any:
    """GET ``url`` and decode it; ``None`` for any failure (used by probes that tolerate silence)."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
