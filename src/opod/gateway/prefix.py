"""A request's prefix, as block hashes the prefix index can look up.

The hashes must be the ones the engine's cache holds, so they come from the
model's own tokens with its chat template applied. Where the leader holds the
engine's tokenizer itself (``LOCAL_TOKENIZERS``: the simulator's, in contract) it
tokenizes in process; for any other engine it asks a worker holding the model
(``/v1/tokenize``, signed, with a short timeout). The routing benchmark measures
the worker's round trip on every request as well beyond its noise, so the local
way stays where it exists. No answer in time means no hashes: the request is
routed by load and the sticky pin instead, never held up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from opod.contract import nodeapi
from opod.contract.blockhash import block_hashes
from opod.contract.tokenizer import Tokenizer
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable

log = logging.getLogger("opod.gateway")

MAX_BLOCKS = 256
"""Only a prompt's leading blocks matter for matching; beyond this many the rest is not hashed."""
TOKENIZE_TIMEOUT = 0.25

LOCAL_TOKENIZERS: dict[str, type[Tokenizer]] = {"sim": Tokenizer}
"""Engines whose tokenizer (and chat template) the leader has: engine id → tokenizer."""


@dataclass(frozen=True, slots=True)
class _Plan:
    serving: list[NodeState]
    generation: int
    holders: list[NodeState]
    block_size: int
    """0: not worth hashing."""
    local: Tokenizer | None
    """The tokenizer every holder's engine uses, when the leader has it; None means ask a worker."""


class PrefixHasher:
    def __init__(self, fleet: Fleet, index: PrefixIndex, workers: WorkerClient) -> None:
        self.fleet = fleet
        self.index = index
        self.workers = workers
        self._plans: dict[str, _Plan] = {}
        self._tokenizers: dict[str, Tokenizer] = {}

    def hashes_now(self, model: str, payload: dict[str, Any]) -> list[str] | None:
        """``[]`` when hashing would not change where the request goes; ``None`` when a worker must be asked."""
        plan = self._plan(model)
        if plan.block_size <= 0:
            return []
        if plan.local is None:
            return None
        tokens = _local_tokens(plan.local, payload)
        return self._hash(tokens, plan) if tokens else []

    async def hashes(self, model: str, payload: dict[str, Any]) -> list[str]:
        """The request's block hashes; empty when there is nothing to hash or no worker answered in time."""
        ready = self.hashes_now(model, payload)
        return ready if ready is not None else await self.hashes_from_worker(model, payload)

    async def hashes_from_worker(self, model: str, payload: dict[str, Any]) -> list[str]:
        """The hashes of tokens a worker holding ``model`` gives back: where :meth:`hashes_now` said ``None``."""
        plan = self._plan(model)
        tokens = await self._worker_tokens(model, payload, plan.holders)
        return self._hash(tokens, plan) if tokens else []

    @staticmethod
    def _hash(tokens: list[int], plan: _Plan) -> list[str]:
        return block_hashes(tokens[: MAX_BLOCKS * plan.block_size], plan.block_size)

    def _plan(self, model: str) -> _Plan:
        """How to hash ``model``'s requests, kept while its live workers and the index's reporters stay the same."""
        serving = self.fleet.workers_for(model)
        plan = self._plans.get(model)
        if plan is not None and plan.serving is serving and plan.generation == self.index.generation:
            return plan
        holders = [n for n in serving if self.index.reports(n.id)]
        # One place to go, or nobody reporting blocks: the hashes would not change where it goes.
        block_size = self.index.block_size([n.id for n in holders]) if len(serving) >= 2 and holders else 0
        plan = _Plan(serving, self.index.generation, holders, block_size, self._local_tokenizer(holders))
        self._plans[model] = plan
        return plan

    def _local_tokenizer(self, holders: list[NodeState]) -> Tokenizer | None:
        engines = {n.engine_id for n in holders}
        if len(engines) != 1:
            return None
        engine = engines.pop()
        make = LOCAL_TOKENIZERS.get(engine)
        if make is None:
            return None
        tokenizer = self._tokenizers.get(engine)
        if tokenizer is None:
            tokenizer = self._tokenizers[engine] = make()
        return tokenizer

    async def _worker_tokens(self, model: str, payload: dict[str, Any], holders: list[NodeState]) -> list[int]:
        messages = payload.get("messages")
        request = nodeapi.TokenizeRequest(model=model)
        if isinstance(messages, list):
            request.messages = [
                nodeapi.TokenizeMessage(role=str(m.get("role", "user")), content=m["content"] if isinstance(m.get("content"), str) else "")
                for m in messages if isinstance(m, dict)
            ]
        elif isinstance(payload.get("prompt"), str):
            request.prompt = payload["prompt"]
        else:
            return []
        node = min(holders, key=lambda n: n.in_flight)
        try:
            status, body = await self.workers.call_json(node, "POST", nodeapi.PATH_TOKENIZE, request.to_wire(), timeout=TOKENIZE_TIMEOUT)
        except WorkerUnavailable as err:
            log.debug("tokenize on %s failed: %s", node.id, err)
            return []
        if status != 200 or not isinstance(body, dict):
            return []
        tokens = body.get("tokens")
        return tokens if isinstance(tokens, list) else []


def _local_tokens(tokenizer: Tokenizer, payload: dict[str, Any]) -> list[int]:
    messages = payload.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        return tokenizer.encode_chat(messages)
    prompt = payload.get("prompt")
    return tokenizer.encode(prompt) if isinstance(prompt, str) else []
