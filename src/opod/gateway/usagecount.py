"""A prompt's tokens counted after the fact, for a usage row the engine's own count never reached.

An engine states a streamed request's prompt tokens in its last chunk; a stream its client left, or
that its engine broke off, ends before that chunk. Such a row waits, off the request's path, for a
count from the worker that served it (its ``/v1/tokenize``, the model's chat template applied, so the
count is the engine's own); when that worker cannot count (its engine is down, say), the row carries
an estimate from the prompt's size instead. The row's route says which (``"prompt_tokens":
"counted"`` or ``"estimated"``). An answer that ended normally never comes here.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from opod.contract import nodeapi
from opod.gateway.tokenize import Tokenize
from opod.http.nodeclient import WorkerUnavailable

log = logging.getLogger("opod.gateway")

BYTES_PER_TOKEN = 4
"""The estimate's rate: about four bytes of English text per token, for the tokenizers opod serves."""
COUNT_TIMEOUT = 3.0
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
    """The prompt's tokens guessed from the size of its text (at least 1 for a prompt that has any)."""
    size = 0
    messages = payload.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            size += len(str(message.get("role") or "")) + len((_text_of(message.get("content")) or "").encode())
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        size += len(prompt.encode())
    return math.ceil(size / BYTES_PER_TOKEN)


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
