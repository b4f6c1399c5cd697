"""The ledger's writers wait for work: a wake-up, their stop, or a while, whichever comes first."""

from __future__ import annotations

import asyncio


async def wait_any(seconds: float, *events: asyncio.Event) -> None:
    """Until one of ``events`` is set or ``seconds`` have passed: an idle writer stops as soon as it is told."""
    waits = {asyncio.ensure_future(event.wait()) for event in events}
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
