"""Calling the synchronous store from async code: one helper, so every call stays a typed method call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


async def run_sync(call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``call(*args, **kwargs)`` in a worker thread and return its result.

    The store (SQLAlchemy) blocks; calling it on the event loop would stall every
    request in flight. Passing the bound method itself (``run_sync(store.create_key,
    kind=...)``) lets a type checker and a reader follow the call into the store.
    """
    return await asyncio.to_thread(call, *args, **kwargs)
