"""A leader's graceful stop of ``/v1``: no new request, and those in flight given a grace to finish."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from opod.gateway.admission import Admission

STOPPING_RETRY_AFTER = 5
"""``Retry-After`` of a request refused while the leader stops: long enough not to hammer it, short
enough for a client behind a balancer to find another leader, or this one started again."""


async def drain(admission: Admission, grace: float, hurry: asyncio.Event | None, say: Callable[[str], None]) -> int:
    """Take no new request (503 with ``Retry-After``, the waiting ones too) and give those in flight up
    to ``grace`` seconds to finish, or until ``hurry`` is set; says on the console which happened.
    Returns how many are still in flight, to be cut off."""
    in_flight = admission.close(STOPPING_RETRY_AFTER)
    if not in_flight:
        say("stopping: no request in flight")
        return 0
    if grace <= 0 or (hurry is not None and hurry.is_set()):
        say(f"stopping now: {_requests(in_flight)} in flight are cut off")
        return in_flight
    say(
        f"stopping: {_requests(in_flight)} in flight, waiting up to {grace:g} s for them to finish "
        "(Ctrl-C again to stop now)"
    )
    started = asyncio.get_running_loop().time()
    settled = asyncio.create_task(admission.settled(grace))
    waits: set[asyncio.Future[Any]] = {settled}
    if hurry is not None:
        waits.add(asyncio.ensure_future(hurry.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    left = admission.in_flight
    took = asyncio.get_running_loop().time() - started
    if not left:
        say(f"stopping: the requests in flight finished in {took:.1f} s")
    elif hurry is not None and hurry.is_set():
        say(f"stopping now, as asked: {_requests(left)} in flight are cut off")
    else:
        say(
            f"stopping: {_requests(left)} still in flight after {grace:g} s are cut off "
            "(OPOD_STOP_GRACE gives them longer)"
        )
    return left


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"
