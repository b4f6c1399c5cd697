"""The two answering protocols ``python -m bench plumbing`` measures, shared by its servers and its in-process run.

- :class:`BareAnswer`: a bare httptools protocol that answers every request with one fixed chat completion.
- :func:`answer`: the handler of opod's server (``opod.http.fastpath``'s short way) that reads the request as
  the gateway's does (``headers_of``, ``read_whole``) and answers the same completion (``PreparedResponse``).
"""

from __future__ import annotations

import asyncio

import httptools
from starlette.requests import Request
from starlette.responses import Response

from opod.http.fastpath import PreparedResponse, headers_of, read_whole

PATH = "/v1/chat/completions"
ANSWER = (
    b'{"id":"chatcmpl-plumbing","object":"chat.completion","created":0,"model":"sim-chat","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"one two three four five six seven eight"},"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":8,"completion_tokens":8,"total_tokens":16}}'
)
JSON = [(b"content-type", b"application/json")]


class BareAnswer(asyncio.Protocol):
    """Each whole request answered with :data:`ANSWER`, nothing read of it but its framing."""

    reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(ANSWER),
        ANSWER,
    )

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.transport.write(self.reply)


async def answer(request: Request) -> Response:
    headers_of(request)
    read_whole(request)
    return PreparedResponse(ANSWER, 200, JSON)
