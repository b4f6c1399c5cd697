"""A request's prefix, as block hashes the prefix index can look up.

The hashes must be the ones the engine's cache holds, so they come from the
model's own tokens with its chat template applied, which only a worker holding
the model can produce (``/v1/tokenize``). Asking on every request would put a
round trip to a worker in front of every request, which the latency goal cannot
pay, so the leader learns instead: a request's hashes are looked up in memory,
by the chain of its leading messages, and when the whole request was not known,
a worker is asked for its tokens in the background and the answer is kept for
the requests that come after it. The previous turns of a conversation, and a
system prompt many conversations share, are what a cache reuses, and those were
seen before.

A message list the leader learnt also teaches its shorter prefixes: each keeps
the hashes every continuation seen so far has in common (the one continuation
seen, until a second one differs). A prefix never seen is not hashed: the
request is routed by load and the sticky pin, never held up.

A short prompt is not hashed at all (``opod.fleet.affinity.worth_placing``, estimated from its text): a
cache hit on it would save less prefill than learning it costs (a tokenize call, the leader's and a
worker's CPU), and short one-off prompts are most of some workloads. A conversation is learnt once its
turns add up to a prompt that long.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.fleet.affinity import PLACED_FROM_CHARS, worth_placing
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet, NodeState
from opod.gateway.tokenize import Tokenize
from opod.http.nodeclient import WorkerUnavailable

log = logging.getLogger("opod.gateway")

MAX_BLOCKS = 256
"""Only a prompt's leading blocks matter for matching; beyond this many the rest is not hashed."""
PREFIXES_KEPT = 50_000
"""Message prefixes remembered, least recently used forgotten first."""
LEARNING_AT_ONCE = 8
"""Tokenize calls in flight; a request seen while all are busy is learnt the next time it comes."""

Hashes = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Plan:
    serving: list[NodeState]
    generation: int
    holders: list[NodeState]
    block_size: int
    """0: not worth hashing."""


@dataclass(slots=True)
class _Known:
    own: Hashes | None = None
    """The hashes of exactly this message list, as a request (generation prompt included)."""
    shared: Hashes | None = None
    """What the hashes of every longer message list seen beginning with this one have in common."""


@dataclass(frozen=True, slots=True)
class _Prompt:
    """A request reduced to what its tokens depend on."""

    model: str
    keys: list[int]
    """One key per leading message (or one for a text prompt): ``keys[i]`` names the first ``i + 1``."""
    messages: list[tuple[str, str]]
    """The leading text messages, role and content; empty for a text prompt."""
    text: str = ""

    @property
    def chars(self) -> int:
        """The characters of the text hashed: what its tokens are estimated by."""
        return len(self.text) + sum(len(content) for _, content in self.messages)

    def request(self) -> nodeapi.TokenizeRequest:
        if not self.messages:
            return nodeapi.TokenizeRequest(model=self.model, prompt=self.text)
        return nodeapi.TokenizeRequest(
            model=self.model, messages=[nodeapi.TokenizeMessage(role=r, content=c) for r, c in self.messages]
        )


class PrefixHasher:
    def __init__(
        self,
        fleet: Fleet,
        index: PrefixIndex,
        tokenize: Tokenize,
        *,
        kept: int = PREFIXES_KEPT,
        at_once: int = LEARNING_AT_ONCE,
    ) -> None:
        self.fleet = fleet
        self.index = index
        self.tokenize = tokenize
        self.kept = kept
        self.at_once = at_once
        self._plans: dict[str, _Plan] = {}
        self._known: OrderedDict[int, _Known] = OrderedDict()
        self._learning: dict[int, asyncio.Task[None]] = {}

    def hashes(self, model: str, payload: dict[str, Any]) -> list[str]:
        """The request's block hashes as far as the leader knows them; empty when hashing would not change where it
        goes, or the prompt is too short to place by its prefix."""
        if not worth_placing(payload):
            return []
        plan = self._plan(model)
        if plan.block_size <= 0:
            return []
        prompt = _prompt(model, plan.block_size, payload)
        if prompt is None:
            return []
        last = prompt.keys[-1]
        whole = self._known.get(last)
        if whole is not None and whole.own is not None:  # a request seen before: the common case, one look-up
            self._known.move_to_end(last)
            return list(whole.own)
        if prompt.chars >= PLACED_FROM_CHARS:  # placed for its text, not only for a part that follows it
            self._learn_later(prompt, plan)
        return list(self._lookup(prompt.keys))

    async def settle(self) -> None:
        """Wait for the tokenize calls in flight; what they learn applies from the next request."""
        while self._learning:
            await asyncio.gather(*self._learning.values(), return_exceptions=True)

    async def close(self) -> None:
        for task in self._learning.values():
            task.cancel()
        await asyncio.gather(*self._learning.values(), return_exceptions=True)
        self._learning.clear()

    def _lookup(self, keys: list[int]) -> Hashes:
        for depth in range(len(keys), 0, -1):
            known = self._known.get(keys[depth - 1])
            if known is None:
                continue
            self._known.move_to_end(keys[depth - 1])
            if depth == len(keys) and known.own is not None:
                return known.own
            return known.shared or known.own or ()
        return ()

    def _learn_later(self, prompt: _Prompt, plan: _Plan) -> None:
        key = prompt.keys[-1]
        if key in self._learning or len(self._learning) >= self.at_once or not plan.holders:
            return
        node = min(plan.holders, key=lambda n: n.in_flight)
        task = asyncio.create_task(self._learn(prompt, node, plan.block_size), name="learn a prefix")
        self._learning[key] = task
        task.add_done_callback(lambda _: self._learning.pop(key, None))

    async def _learn(self, prompt: _Prompt, node: NodeState, block_size: int) -> None:
        try:
            tokens = await self.tokenize(node.id, prompt.request())
        except (WorkerUnavailable, OSError, TimeoutError, ValueError) as err:
            log.debug("tokenize on %s failed: %s", node.id, err)
            return
        if not tokens:
            return
        self._remember(prompt.keys, tuple(block_hashes(tokens[: MAX_BLOCKS * block_size], block_size)))

    def _remember(self, keys: list[int], hashes: Hashes) -> None:
        self._entry(keys[-1]).own = hashes
        for key in keys[:-1]:
            entry = self._entry(key)
            entry.shared = hashes if entry.shared is None else _common(entry.shared, hashes)
        while len(self._known) > self.kept:
            self._known.popitem(last=False)

    def _entry(self, key: int) -> _Known:
        entry = self._known.get(key)
        if entry is None:
            entry = self._known[key] = _Known()
        else:
            self._known.move_to_end(key)
        return entry

    def _plan(self, model: str) -> _Plan:
        """How to hash ``model``'s requests, kept while its live workers and the index's reporters stay the same."""
        serving = self.fleet.workers_for(model)
        plan = self._plans.get(model)
        if plan is not None and plan.serving is serving and plan.generation == self.index.generation:
            return plan
        holders = [n for n in serving if self.index.reports(n.id)]
        # One place to go, or nobody reporting blocks: the hashes would not change where it goes.
        block_size = self.index.block_size([n.id for n in holders]) if len(serving) >= 2 and holders else 0
        plan = _Plan(serving, self.index.generation, holders, block_size)
        self._plans[model] = plan
        return plan


def _prompt(model: str, block_size: int, payload: dict[str, Any]) -> _Prompt | None:
    """The keys of a chat's leading text messages, or of a text prompt; None when neither is there.

    A message whose content is not text (image parts, say) ends what is hashed: the
    tokens after it depend on what the engine makes of it.
    """
    key = hash((model, block_size))
    messages = payload.get("messages")
    if isinstance(messages, list):
        keys: list[int] = []
        kept: list[tuple[str, str]] = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, str):
                break
            role = str(message.get("role", "user"))
            key = hash((key, role, content))
            keys.append(key)
            kept.append((role, content))
        return _Prompt(model, keys, kept) if keys else None
    prompt = payload.get("prompt")
    if isinstance(prompt, str) and prompt:
        return _Prompt(model, [hash((key, prompt))], [], prompt)
    return None


def _common(a: Hashes, b: Hashes) -> Hashes:
    if a is b:
        return a
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a if n == len(a) else a[:n]
