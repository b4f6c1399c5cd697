"""One chat request through the ``openai`` package, as a user's code makes it, under a request id of its own."""

from __future__ import annotations

import secrets
from typing import Any

import openai


def ask(client: openai.OpenAI, model: str, content: str, *, max_tokens: int = 8, **extra: Any) -> tuple[str, Any]:
    """The request's ``X-Request-Id``, and its answer's text (a stream's put together) or the error it raised."""
    request_id = "chat-" + secrets.token_hex(6)
    try:
        answer = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            extra_headers={"X-Request-Id": request_id},
            **extra,
        )
    except openai.APIStatusError as err:
        return request_id, err
    if extra.get("stream"):
        return request_id, "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return request_id, answer.choices[0].message.content
