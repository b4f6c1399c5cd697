"""A request's tokens counted after the fact, for a usage row the engine's own count never reached.

An engine states a request's prompt tokens at the end of its answer; a request its client left, or
that its engine broke off, ends before that. Such a row waits, off the request's path, for a
count from the worker that served it (its ``/v1/tokenize``, the model's chat template applied, so the
count is the engine's own); when that worker cannot count (its engine is down, say), the row carries
an estimate from the prompt's size instead. The row's route says which (``"prompt_tokens":
"counted"`` or ``"estimated"``). An answer that ended normally never comes here.

The completion tokens of a stream are those it carried. A whole answer left by its client never
says how far the engine got: its tokens are estimated from how long the engine worked on it, at the
rate this leader saw the model answer (:class:`DecodeRates`), and the route says ``"completion_tokens":
"estimated"``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from opod.contract import nodeapi
from opod.gateway.promptsize import prompt_size
from opod.gateway.tokenize import Tokenize
from opod.http.nodeclient import WorkerUnavailable

log = logging.getLogger("opod.gateway")

BYTES_PER_TOKEN = 4
"""The estimate's rate: about four bytes of English text per token, for the tokenizers opod serves."""
COUNT_TIMEOUT = 3.0
COUNT_NOW_TIMEOUT = 1.0
"""A count on the request's way (its budget reservation): a worker slower than this leaves it to the bound."""
AT_ONCE = 32
"""Counts in flight at once; a row beyond them is estimated at once rather than queued."""

Then = Callable[[int, str], None]
"""Called once with the prompt tokens and how they were found: ``counted`` or ``estimated``."""


class PromptCounter:
    def __init__(self, tokenize: Tokenize, *, at_once: int = AT_ONCE, timeout: float = COUNT_TIMEOUT) -> None:
        self.tokenize = tokenize
        self.at_once = at_once
        self.timeout = timeout
        self._counting: set[asyncio.Task[None]] = set()

    def later(self, node_id: str, model: str, payload: dict[str, Any], then: Then) -> None:
        """Count the prompt of ``payload`` on ``node_id`` in the background and call ``then``; at once
        with an estimate when nothing could be asked or too many counts are in flight."""
        request = tokenize_request(model, payload)
        if request is None or not node_id or len(self._counting) >= self.at_once:
            then(estimate(payload), "estimated")
            return
        task = asyncio.get_running_loop().create_task(
            self._count(node_id, request, payload, then), name="count a prompt"
        )
        self._counting.add(task)
        task.add_done_callback(self._counting.discard)

    async def _count(self, node_id: str, request: nodeapi.TokenizeRequest, payload: dict[str, Any], then: Then) -> None:
        tokens: list[int] | None = None
        try:
            tokens = await asyncio.wait_for(self.tokenize(node_id, request), self.timeout)
        except (WorkerUnavailable, OSError, TimeoutError, ValueError) as err:
            log.debug("counting a prompt on %s failed (%s); its usage row carries an estimate", node_id, err)
        except asyncio.CancelledError:
            then(estimate(payload), "estimated")  # the leader is closing: the row is written all the same
            raise
        if tokens:
            then(len(tokens), "counted")
        else:
            then(estimate(payload), "estimated")

    async def count_now(self, node_id: str, model: str, payload: dict[str, Any]) -> int | None:
        """The prompt's tokens as ``node_id``'s engine makes them, the chat template applied; ``None``
        when the prompt is not all text or the worker cannot say within :data:`COUNT_NOW_TIMEOUT`."""
        request = tokenize_request(model, payload)
        if request is None or request.messages is None:
            return None
        try:
            tokens = await asyncio.wait_for(self.tokenize(node_id, request), COUNT_NOW_TIMEOUT)
        except (WorkerUnavailable, OSError, TimeoutError, ValueError) as err:
            log.debug("counting a prompt on %s failed (%s); it is reserved by its bound", node_id, err)
            return None
        return len(tokens) if tokens else None

    async def settle(self) -> None:
        """Wait for the counts in flight, so their rows are written before the ledger closes."""
        while self._counting:
            await asyncio.gather(*self._counting, return_exceptions=True)


def tokenize_request(model: str, payload: dict[str, Any]) -> nodeapi.TokenizeRequest | None:
    """What the engine tokenized for ``payload``: its messages as text, or its text prompt; ``None`` when
    a part is not text (an image's tokens are the engine's own business: the row is estimated)."""
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        kept = []
        for message in messages:
            if not isinstance(message, dict):
                return None
            text = _text_of(message.get("content"))
            if text is None:
                return None
            kept.append(nodeapi.TokenizeMessage(role=str(message.get("role") or "user"), content=text))
        return nodeapi.TokenizeRequest(model=model, messages=kept)
    prompt = payload.get("prompt")
    if isinstance(prompt, str) and prompt:
        return nodeapi.TokenizeRequest(model=model, prompt=prompt)
    return None


def estimate(payload: dict[str, Any]) -> int:
    """The prompt's tokens guessed from the size of its text (at least 1 for a prompt that has any): each
    prompt of a list, each input, each document."""
    prompt = prompt_size(payload)
    return math.ceil(sum(prompt.texts) / BYTES_PER_TOKEN) + sum(prompt.tokens)


RATE_WEIGHT = 0.2
"""How much one answer moves a model's decode rate."""


class DecodeRates:
    """How fast each model's answers come, in completion tokens per second of an engine's work, as this
    leader saw them: what a whole answer left by its client is estimated by."""

    def __init__(self) -> None:
        self._rates: dict[str, float] = {}

    def learn(self, model: str, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        known = self._rates.get(model)
        self._rates[model] = rate if known is None else known + RATE_WEIGHT * (rate - known)

    def estimate(self, model: str, seconds: float, most: int | None) -> int | None:
        """The tokens ``model`` makes in ``seconds``, at most ``most``; ``None`` when no answer of it was seen."""
        rate = self._rates.get(model)
        if rate is None:
            return None
        tokens = round(rate * max(0.0, seconds))
        return tokens if most is None else min(tokens, most)


def _text_of(content: object) -> str | None:
    """A message's content as text: a string, or the text parts of a list; ``None`` with another part."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "".join(texts)
    return None
