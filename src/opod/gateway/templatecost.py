"""What a model's chat template adds to a prompt, counted once per model by a worker holding it.

A budget's reservation must bound a chat's prompt as the engine will see it, template and all.
Asking a worker to count every chat puts a round trip on each request's way; the template's
own share barely changes from one chat to the next, so it is counted once per model, off the
requests' way: the tokens around one short message (the generation prompt, a default system
prompt, the role markers) and the most any further message adds besides its text. With those,
:func:`opod.gateway.promptsize.prompt_size` bounds a chat from its text alone (each byte at most a
token). Until a model's template is known, and where that bound would be refused, the gateway
still has a worker count the chat itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from opod.contract import nodeapi
from opod.gateway.promptsize import TemplateCost
from opod.gateway.tokenize import Tokenize
from opod.http.nodeclient import WorkerUnavailable

log = logging.getLogger("opod.gateway")

RELEARN_AFTER = 600.0
"""Seconds a learnt template is trusted before it is counted again (in the background): a model's
weights, and with them its template, may change under its name."""
RETRY_AFTER = 30.0
"""Seconds before a template that could not be counted is tried again."""
PROBE = "x"
"""The text of the probe messages: one byte, one token in the tokenizers opod serves."""
ROLES = ("user", "assistant", "system")


class TemplateCosts:
    """Each model's :class:`TemplateCost`, learnt in the background from a worker's counts."""

    def __init__(self, tokenize: Tokenize, clock: Callable[[], float] = time.monotonic) -> None:
        self.tokenize = tokenize
        self.clock = clock
        self._known: dict[str, tuple[TemplateCost, float]] = {}
        self._tried: dict[str, float] = {}
        self._learning: dict[str, asyncio.Task[None]] = {}

    def known(self, model: str, holder: Callable[[], str | None]) -> TemplateCost | None:
        """``model``'s template cost when learnt; learning starts, on the node ``holder`` names (none: not now),
        when it is not, or is old. ``holder`` is asked only then: a known cost costs a request one look-up."""
        found = self._known.get(model)
        now = self.clock()
        if found is None or now - found[1] > RELEARN_AFTER:
            node_id = None
            if model not in self._learning and now - self._tried.get(model, -RETRY_AFTER) >= RETRY_AFTER:
                node_id = holder()
            if node_id is not None:
                self._tried[model] = now
                task = asyncio.get_running_loop().create_task(self._learn(node_id, model), name="count a template")
                self._learning[model] = task
                task.add_done_callback(lambda _: self._learning.pop(model, None))
        return found[0] if found is not None else None

    async def _learn(self, node_id: str, model: str) -> None:
        one = await self._count(node_id, model, [("user", PROBE)])
        if one is None:
            return
        more = [await self._count(node_id, model, [("user", PROBE), (role, PROBE)]) for role in ROLES]
        more.append(await self._count(node_id, model, [("system", PROBE), ("user", PROBE)]))
        if any(m is None for m in more):
            return
        per_message = max(0, max(m for m in more if m is not None) - one)
        self._known[model] = (TemplateCost(one, per_message), self.clock())

    async def _count(self, node_id: str, model: str, messages: list[tuple[str, str]]) -> int | None:
        request = nodeapi.TokenizeRequest(
            model=model, messages=[nodeapi.TokenizeMessage(role=role, content=text) for role, text in messages]
        )
        try:
            tokens = await self.tokenize(node_id, request)
        except (WorkerUnavailable, OSError, TimeoutError, ValueError) as err:
            log.debug("counting the chat template of %s on %s failed (%s); tried again later", model, node_id, err)
            return None
        return len(tokens) if tokens else None

    async def close(self) -> None:
        for task in list(self._learning.values()):
            task.cancel()
        await asyncio.gather(*self._learning.values(), return_exceptions=True)
