"""The hot routes' short way through the HTTP server, for the few fixed paths on the data path.

Two layers, one table of (method, path) → handler:

- :class:`FastPath`, an ASGI dispatcher in front of a Starlette app: a dictionary
  lookup finds a hot route's handler, so it skips Starlette's middleware and
  route matching; everything else goes to the full app.
- :class:`FastHttpProtocol`, uvicorn's HTTP protocol with one shortcut: a plain
  request for a hot route (HTTP/1.1, a body of known size up to ``BODY_LIMIT``,
  no ``Expect``, nothing pipelined ahead of it) is read whole and handed to its
  handler directly, and the handler's response is written to the socket in one
  piece (or, when streamed, in chunks as they come). That skips the ASGI
  messages, the per-request event and cycle objects, and the header checks
  (the data-plane bench measures what that saves). Any other
  request takes uvicorn's usual way to the same :class:`FastPath` app, so the
  two ways answer alike.

A request whose client goes away is cancelled, both ways, whether its answer is
streamed or whole: its handler's task is cancelled where it waits (a relay waiting
on an engine), so the engine's request is closed and the engine stops working on
it. A stream's own cleanup reports the tokens that were sent.

The shortcut stands on uvicorn's internals: :class:`FastHttpProtocol` subclasses
its private httptools protocol and reads that protocol's per-connection state.
Everything it reads is named in :data:`UVICORN_INTERNALS` and checked by
:func:`uvicorn_seam_problems`, which ``tests/http/test_fastpath.py`` runs, so an
upgrade that moves them fails by name; the same tests check on a real socket
that requests still take the short way and answer alike.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping

import uvicorn
from starlette.requests import Request, empty_receive, empty_send
from starlette.responses import AsyncContentStream, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

Handler = Callable[[Request], Awaitable[Response]]

log = logging.getLogger("opod.http.fastpath")

BODY_LIMIT = 1 << 20
"""Bodies up to this size take the short way; larger ones (and bodies of unknown size) uvicorn's, which streams them."""


class ReadRequest(Request):
    """A hot request whose body the server has already read whole.

    The body sits where Starlette caches a read body, so ``body()`` and ``stream()``
    return it; :func:`read_whole` hands it over without an async iteration, and
    ``header_map`` holds the headers as a dictionary of raw bytes, built once.
    """

    def __init__(self, scope: Scope, body: bytes, fields: dict[bytes, bytes] | None = None) -> None:
        # Request.__init__'s fields set here, not through its chain of two __init__s: one is made per hot request.
        # ``tests/http/test_fastpath.py`` checks that they are Request's own, so a Starlette that adds one fails there.
        self.scope = scope
        self._receive = empty_receive
        self._send = empty_send
        self._stream_consumed = False
        self._is_disconnected = False
        self._form = None
        self._body = body
        self.header_map = header_map(scope["headers"]) if fields is None else fields
        """``fields``: the request's :func:`header_map`, when the server has made it already."""


def header_map(raw: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """ASGI headers as a dictionary of raw bytes by lower-case name; the first of a repeated one wins,
    as in ``Headers.get``. Built by ``dict`` itself: a request's handler decodes only what it reads."""
    return dict(reversed(raw))


def headers_of(request: Request) -> dict[bytes, bytes]:
    """A request's headers as a dictionary of raw bytes (the hot way built it already)."""
    if isinstance(request, ReadRequest):
        return request.header_map
    return header_map(request.scope["headers"])


def read_whole(request: Request) -> bytes | None:
    """The body the server read already, or None when it must be read from the ASGI stream."""
    return request._body if isinstance(request, ReadRequest) else None


class PreparedResponse(Response):
    """A whole answer given its body as bytes and its header lines as bytes (lower-case names), sent unchanged.

    A relayed answer's headers are known as bytes already, so they are not encoded again, and its
    body needs no rendering: Starlette's ``__init__`` is not run, and only the framing it would add
    (``content-length``, by its rule) is added here.
    """

    def __init__(self, body: bytes, status_code: int, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status_code
        self.background = None
        self.body = body
        if status_code < 200 or status_code in (204, 304):
            self.raw_headers = raw_headers.copy()
        else:
            self.raw_headers = [(b"content-length", b"%d" % len(body)), *raw_headers]


class FastPath:
    def __init__(self, routes: Mapping[tuple[str, str], Handler], app: ASGIApp) -> None:
        self.routes = dict(routes)
        self.app = app
        self.targets: dict[tuple[bytes, bytes], tuple[Handler, str, str]] = {}
        """(method, request target) as received → (handler, method, path), for targets that name a hot route
        exactly (no query, nothing escaped): the server's per-request lookup. Bounded by the routes."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            handler = self.routes.get((scope["method"], scope["path"]))
            if handler is not None:
                response = await _answer_unless_left(handler, scope, receive)
                if response is not None:
                    await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _answer_unless_left(handler: Handler, scope: Scope, receive: Receive) -> Response | None:
    """The handler's answer, or ``None`` when the client left first: the handler is then cancelled.

    Once the body is read, the next ASGI message uvicorn has for the request is ``http.disconnect``,
    and only when the client goes away; it is awaited beside the handler.
    """
    body_read = asyncio.Event()

    async def receive_body() -> Message:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_read.set()
        return message

    async def left() -> None:
        await body_read.wait()
        while (await receive())["type"] != "http.disconnect":
            pass

    answer = asyncio.ensure_future(handler(Request(scope, receive_body)))
    watch = asyncio.ensure_future(left())
    try:
        await asyncio.wait((answer, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not answer.done():
            answer.cancel()
    if answer.cancelled():
        return None
    return answer.result()


_CLOSE_END = b"connection: close\r\n\r\n"
_HEADER_LINE = b"%b: %b\r\n"
_INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class _Exchange:
    """A hot request in progress, standing where uvicorn keeps its request cycle (``self.cycle``)."""

    __slots__ = (
        "handler",
        "scope",
        "fields",
        "body",
        "keep_alive",
        "response_complete",
        "disconnected",
        "answering",
        "task",
    )

    def __init__(self, handler: Handler, scope: Scope, fields: dict[bytes, bytes], keep_alive: bool) -> None:
        self.handler = handler
        self.scope = scope
        self.fields = fields
        """The request's headers by name (:func:`header_map`), made once for the way's choice and its handler."""
        self.body: list[bytes] = []
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.answering = True
        """The handler runs or its answer is being written: a client that leaves now cancels it."""
        self.task: asyncio.Task[None] | None = None

    @property
    def message_event(self) -> _Exchange:
        return self  # uvicorn calls ``cycle.message_event.set()`` when the connection is lost

    def set(self) -> None:
        if self.disconnected and self.answering and self.task is not None:
            self.task.cancel()


UVICORN_INTERNALS = {
    "attributes": (
        "app",
        "loop",
        "parser",
        "tasks",
        "transport",
        "flow",
        "url",
        "headers",
        "scope",
        "cycle",
        "expect_100_continue",
        "server_state",
        "pipeline",
        "timeout_keep_alive",
        "timeout_keep_alive_task",
    ),
    "methods": (
        "connection_made",
        "connection_lost",
        "_unset_keepalive_if_required",
        "_start_asgi_task",
        "timeout_keep_alive_handler",
        "on_header",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "on_response_complete",
    ),
    "connection_lost": ("self.cycle.disconnected = True", "self.cycle.message_event.set()"),
    "data_received": ("self._unset_keepalive_if_required()",),
}
"""What :class:`FastHttpProtocol` reads or overrides of uvicorn's ``HttpToolsProtocol``: its per-connection
attributes, the methods it overrides or calls, how a lost connection tells the request in progress
(``cycle``, which a hot request's :class:`_Exchange` stands in for), and that a request's bytes mark the
connection busy (the keep-alive timer's rule)."""


def uvicorn_seam_problems() -> list[str]:
    """What of :data:`UVICORN_INTERNALS` the installed uvicorn no longer has; empty when the seam holds."""
    problems = []
    source = inspect.getsource(HttpToolsProtocol)
    for name in UVICORN_INTERNALS["attributes"]:
        if f"self.{name} =" not in source and f"self.{name}:" not in source:
            problems.append(f"HttpToolsProtocol no longer sets self.{name}")
    for name in UVICORN_INTERNALS["methods"]:
        if not callable(getattr(HttpToolsProtocol, name, None)):
            problems.append(f"HttpToolsProtocol has no method {name}()")
    for method in ("connection_lost", "data_received"):
        source = inspect.getsource(getattr(HttpToolsProtocol, method))
        for line in UVICORN_INTERNALS[method]:
            if line not in source:
                problems.append(f"HttpToolsProtocol.{method} no longer does {line!r}")
    status_line = getattr(httptools_impl, "STATUS_LINE", None)
    ok_line = status_line.get(200) if isinstance(status_line, dict) else None
    if not isinstance(ok_line, bytes) or not ok_line.startswith(b"HTTP/1.1 200"):
        problems.append("httptools_impl.STATUS_LINE is no longer a dict of status → b'HTTP/1.1 <code> ...' lines")
    if "self.read_paused" not in inspect.getsource(FlowControl):
        problems.append("FlowControl no longer keeps read_paused")
    for name in ("get_http_version", "get_method", "should_upgrade", "should_keep_alive"):
        if not hasattr(httptools_impl.httptools.HttpRequestParser, name):
            problems.append(f"httptools' HttpRequestParser has no {name}()")
    return [f"uvicorn {uvicorn.__version__}: {p}" for p in problems]


class FastHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the short way for hot routes, and a keep-alive timer armed once per idle spell.

    uvicorn arms a fresh timer after every answer and cancels it when the next request's bytes come:
    a timer made and dropped per request. Here the timer stays armed while the connection is busy, and
    when it fires it looks at when the connection last went idle: it closes a connection idle for
    ``timeout_keep_alive``, sleeps again for the rest of that time, or, on a busy connection, lets the
    next answer arm it again. A connection is closed after the same idle time either way.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.idle_since: float | None = None
        """The loop's time when its last answer was complete and nothing followed; ``None`` while busy."""
        super().connection_made(transport)
        app = self.app
        self.hot_routes: dict[tuple[str, str], Handler] = app.routes if isinstance(app, FastPath) else {}
        self.hot_targets: dict[tuple[bytes, bytes], tuple[Handler, str, str]] = (
            app.targets if isinstance(app, FastPath) else {}
        )
        self.hot: _Exchange | None = None

    def _unset_keepalive_if_required(self) -> None:
        self.idle_since = None  # busy: the armed timer, when it fires, leaves the connection open

    def on_response_complete(self) -> None:
        # uvicorn's, arming the keep-alive timer only when none is armed.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.idle_since = None
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self.idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        idle_since = self.idle_since
        if idle_since is None:
            return  # busy: its next answer arms the timer again
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's, but for its Expect flag: the headers by name, made once they are all in, say that.
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        # The headers by name, made once: they decide the way (a body of known size, no Expect), and its handler
        # reads them.
        fields = header_map(self.headers)
        expect = fields.get(b"expect")
        self.expect_100_continue = expect is not None and expect.lower() == b"100-continue"
        self.hot = self._hot_exchange(fields)
        if self.hot is None:
            super().on_headers_complete()
        else:
            self.cycle = self.hot  # type: ignore[assignment]  # uvicorn reads only what _Exchange has (UVICORN_INTERNALS)

    def _hot_exchange(self, fields: dict[bytes, bytes]) -> _Exchange | None:
        """The short way's exchange for this request, or None when it must take uvicorn's usual way."""
        if not self.hot_routes or self.expect_100_continue or self.parser.get_http_version() != "1.1":
            return None
        if self.parser.should_upgrade() or (self.cycle is not None and not self.cycle.response_complete):
            return None
        length = fields.get(b"content-length")
        # llhttp has refused a Content-Length that is not all digits, and one sent with a chunked body.
        if b"transfer-encoding" in fields or (length is not None and int(length) > BODY_LIMIT):
            return None
        url, raw_method = self.url, self.parser.get_method()
        scope: Scope = self.scope  # type: ignore[assignment]  # uvicorn types it as its HTTPScope; Starlette reads a Scope
        known = self.hot_targets.get((raw_method, url))
        if known is not None:
            handler, method, path = known
            scope["method"], scope["path"], scope["raw_path"], scope["query_string"] = method, path, url, b""
            return _Exchange(handler, scope, fields, self.parser.should_keep_alive())
        raw_path, _, query = url.partition(b"?")
        if b"%" in raw_path or b"#" in url:
            return None  # escaped paths and fragments are uvicorn's to decode
        method = raw_method.decode("ascii")
        found = self.hot_routes.get((method, raw_path.decode("latin-1")))
        if found is None:
            return None
        path = raw_path.decode("ascii")
        if not query and b"?" not in url:
            self.hot_targets[raw_method, url] = (found, method, path)
        scope["method"], scope["path"], scope["raw_path"], scope["query_string"] = method, path, raw_path, query
        return _Exchange(found, scope, fields, self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.hot is None:
            super().on_body(body)
            return
        self.hot.body.append(body)

    def on_message_complete(self) -> None:
        hot = self.hot
        if hot is None:
            super().on_message_complete()
            return
        self.hot = None
        hot.task = task = self.loop.create_task(self._serve(hot))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _serve(self, hot: _Exchange) -> None:
        started = False
        try:
            response = await hot.handler(ReadRequest(hot.scope, b"".join(hot.body), hot.fields))
            started = True
            if isinstance(response, StreamingResponse):
                await self._write_stream(hot, response)
            elif not hot.disconnected:
                self.transport.write(b"".join(self._head(hot, response, b"", response.body)))
            hot.answering = False
            if response.background is not None:
                await response.background()
        except asyncio.CancelledError:
            if not hot.disconnected:
                raise
            return
        except BaseException as exc:
            log.error("Exception in a hot route's handler", exc_info=exc)
            if not started and not hot.disconnected:
                self.transport.write(_INTERNAL_ERROR)
            self.transport.close()
            return
        hot.response_complete = True
        if hot.disconnected:
            return
        if not hot.keep_alive:
            self.transport.close()
            return
        self.on_response_complete()

    def _head(
        self, hot: _Exchange, response: Response, framing: bytes, body: bytes | memoryview = b""
    ) -> list[bytes | memoryview]:
        """The answer's status line and header lines, ``framing`` among them, and ``body``: to be joined and written."""
        out: list[bytes | memoryview] = [STATUS_LINE[response.status_code]]
        out += map(_HEADER_LINE.__mod__, response.raw_headers)  # each line made by the format's own method
        out += (framing, b"\r\n" if hot.keep_alive else _CLOSE_END, body)
        return out

    async def _write_stream(self, hot: _Exchange, response: StreamingResponse) -> None:
        iterator = response.body_iterator
        if hot.disconnected:
            await _close(iterator)
            return
        self.transport.write(b"".join(self._head(hot, response, b"transfer-encoding: chunked\r\n")))
        try:
            async for chunk in iterator:
                if hot.disconnected:
                    return
                if not isinstance(chunk, bytes):
                    chunk = chunk.encode(response.charset) if isinstance(chunk, str) else bytes(chunk)
                if chunk:
                    self.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    if self.flow.write_paused:
                        await self.flow.drain()
            if not hot.disconnected:
                self.transport.write(b"0\r\n\r\n")
        finally:
            await _close(iterator)


async def _close(iterator: AsyncContentStream) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
