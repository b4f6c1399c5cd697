"""A worker's count of a request's tokens: its signed ``/v1/tokenize``, the model's chat template applied.

Only a worker holding the model can say what its engine makes of a prompt. The prefix hasher
asks to learn a conversation's blocks, the usage counter to count a prompt a stream never
reported; both off the request's path, through this one call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from opod.contract import nodeapi
from opod.fleet.state import Fleet
from opod.http.nodeclient import WorkerClient

TIMEOUT = 3.0
"""Off the request's path: a slow worker delays only a lesson or a count."""

Tokenize = Callable[[str, nodeapi.TokenizeRequest], Awaitable[list[int] | None]]
"""Node id and request → the request's tokens on that node's engine; ``None`` when it cannot say.

Raises :class:`opod.http.nodeclient.WorkerUnavailable` when the worker cannot be reached."""


def worker_tokenizer(fleet: Fleet, workers: WorkerClient) -> Tokenize:
    """Ask the worker ``node_id`` through its signed ``/v1/tokenize`` route."""

    async def tokenize(node_id: str, request: nodeapi.TokenizeRequest) -> list[int] | None:
        node = fleet.get(node_id)
        if node is None:
            return None
        status, body = await workers.call_json(node, "POST", nodeapi.PATH_TOKENIZE, request.to_wire(), timeout=TIMEOUT)
        tokens = body.get("tokens") if status == 200 and isinstance(body, dict) else None
        return tokens if isinstance(tokens, list) else None

    return tokenize
