"""Pooled HTTP/1.1 connections for relaying ``/v1`` requests: leader to workers and engines, worker to engines.

A relay sends one POST and passes the answer on, whole or as it comes; it needs
no cookies, redirects or decompression. A protocol on the event loop with
httptools' parser does just that, with less CPU per relayed request than
aiohttp's client (the routing bench compares them; figures in ``bench/results/``).

Connections are kept alive per origin (host, port, TLS or not) and reused last-in first-out. A
reused connection that the other side had already closed (an idle timeout) is
found before anything is read from it, and the request is sent again on a new
one: nothing of it can have been processed. Every failure is a
``ConnectionError``, so callers treat it like any other network error; a request
given a ``timeout`` that runs past it raises ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from functools import lru_cache
from typing import NamedTuple, cast
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT = 3.0
IDLE_PER_HOST = 512
"""Idle connections kept per upstream; more are closed when released."""
PAUSE_AT = 1 << 20
"""Bytes of an answer held unread before reading from the upstream pauses."""


class UpstreamError(ConnectionError):
    """The upstream could not be reached, broke off, or sent something that is not HTTP/1.1."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request at a time, its answer parsed as it arrives."""

    transport: asyncio.Transport
    __slots__ = (
        "transport",
        "_loop",
        "parser",
        "on_header",
        "on_body",
        "raw_headers",
        "home",
        "timer",
        "closed",
        "error",
        "status",
        "_chunks",
        "_buffered",
        "_waiter",
        "_head",
        "complete",
        "keep_alive",
        "received",
        "_paused",
    )

    def __init__(self) -> None:
        # ``transport`` is set by ``connection_made``, before the pool ever hands the connection out.
        self.closed = False
        self.error: Exception | None = None
        self.home: deque[_Connection] | None = None
        """The pool's idle connections of this one's origin, which it goes back to when released; ``None`` once
        the pool has let it go."""
        self.timer: asyncio.TimerHandle | None = None
        """Ends the request in progress at its deadline, when it has one."""
        self._chunks: deque[bytes] = deque()
        self.on_body = self._chunks.append
        """httptools hands each piece of the body to the deque without a Python call; ``data_received`` counts
        the pieces each feed added."""
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head: asyncio.Future[None] | None = None
        self._paused = False
        # A parser already, as ``start`` makes one: an upstream may speak before it is asked.
        self.raw_headers: dict[bytes, bytes] = {}
        self.on_header = self.raw_headers.__setitem__
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.complete = self.keep_alive = self.received = False

    def start(self, request: bytes, deadline: float | None) -> asyncio.Future[None]:
        """Write ``request``; the future is done once the answer's status line and headers are in.

        At ``deadline`` (the loop's clock), if the answer is not released by then, waiting for its head or
        body raises ``TimeoutError`` and the connection is closed.

        Only a connection whose last answer was read to its end, and that has received nothing since, is
        started again, so its body's state (pieces held, reading paused) is clean already.
        """
        # A parser per answer, whose on_header is the answer's own dictionary's __setitem__: httptools hands
        # it each header without a Python call, and only the headers someone reads are decoded.
        # A plain {}: calling ``dict[bytes, bytes]`` raises and swallows an AttributeError inside every call.
        raw: dict[bytes, bytes] = {}
        self.raw_headers = raw
        self.on_header = raw.__setitem__
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.complete = self.keep_alive = self.received = False
        head = self._head = self._loop.create_future()
        if deadline is not None:
            self.timer = self._loop.call_at(deadline, self._time_out)
        self.transport.write(request)
        return head

    def _time_out(self) -> None:
        self.timer = None
        self._fail(TimeoutError("the upstream did not answer in time"))
        self.transport.close()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one in all but its class
        self._loop = asyncio.get_running_loop()  # asked once: each ask costs a getpid() system call

    def data_received(self, data: bytes) -> None:
        self.received = True
        chunks = self._chunks
        held = len(chunks)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamError(f"the upstream's answer is not valid HTTP/1.1 ({err})"))
            self.transport.close()
        if len(chunks) == held:
            return
        # The pieces of the body this data held (``on_body`` appended them): counted, reading paused past
        # PAUSE_AT, and a reader waiting for the next piece woken, once for them all.
        self._buffered += sum(map(len, itertools.islice(chunks, held, None)))
        if self._buffered > PAUSE_AT and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(
                UpstreamError(
                    f"the upstream closed the connection ({exc})" if exc else "the upstream closed the connection"
                )
            )

    # -- httptools callbacks (on_header is the answer's dictionary, set by ``start``; on_body the deque of pieces) --

    def on_headers_complete(self) -> None:
        parser = self.parser
        self.status = parser.get_status_code()
        self.keep_alive = parser.should_keep_alive()
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)

    def on_message_complete(self) -> None:
        self.complete = True
        # A reader waiting for the end is woken here; one waiting for a piece, in data_received.
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the caller's side ----------------------------------------------------------------------

    def _fail(self, err: Exception) -> None:
        if self.error is None:
            self.error = err
        for future in (self._head, self._waiter):
            if future is not None and not future.done():
                future.set_exception(err)

    async def next_chunk(self) -> bytes:
        """The next piece of the body; ``b""`` once the answer is complete."""
        while not self._chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= PAUSE_AT // 2:
            self._paused = False
            self.transport.resume_reading()
        return chunk


async def _nothing() -> bytes:
    return b""


class UpstreamResponse:
    """An answer being received: status and headers now, the body by ``read`` or ``readany``."""

    __slots__ = ("status", "_raw_headers", "_headers", "_conn", "_pool")

    def __init__(self, conn: _Connection, pool: Upstreams) -> None:
        self.status = conn.status
        self._raw_headers = conn.raw_headers
        self._headers: dict[str, str] | None = None
        self._conn: _Connection | None = conn
        self._pool = pool

    @property
    def headers(self) -> dict[str, str]:
        """Header names in lower case; a repeated header keeps its last value (one repeated in different
        spellings of its name, one of them).

        Decoded when first read: a relayed answer's headers are mostly never read.
        """
        headers = self._headers
        if headers is None:
            headers = self._headers = {}
            for name, value in self._raw_headers.items():
                headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        return headers

    @property
    def content_type(self) -> str:
        """The media type without parameters, or ``""`` when the upstream named none."""
        # Upstreams spell the name in lower case (vLLM, SGLang) or capitalized (llama-server, aiohttp): either is
        # read without decoding every header.
        raw = self._raw_headers.get(b"content-type") or self._raw_headers.get(b"Content-Type")
        value = raw.decode("latin-1") if raw is not None else self.headers.get("content-type", "")
        return value.partition(";")[0].strip().lower()

    def readany(self) -> Coroutine[None, None, bytes]:
        """The next piece of the body as it arrived; ``b""`` at its end.

        The connection's own coroutine, handed over: a coroutine of this one's around it would be one more
        frame to resume for every piece of a stream.
        """
        conn = self._conn
        return _nothing() if conn is None else conn.next_chunk()

    def read_now(self) -> bytes | None:
        """The whole body when all of it has arrived already (the connection goes back to the pool), else ``None``.

        A short answer usually comes in the packet with its headers; taking it here spares the
        awaits of :meth:`read`.
        """
        conn = self._conn
        if conn is None:
            return b""
        if not conn.complete or conn.error is not None or conn._paused:
            return None
        chunks = conn._chunks
        data = b"".join(chunks)
        chunks.clear()
        conn._buffered = 0
        self._conn = None
        self._pool._release(conn)
        return data

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool.

        A read cancelled or broken off closes the connection, so the upstream stops working on the answer.
        """
        data = self.read_now()
        if data is not None:
            return data
        conn = self._conn
        assert conn is not None  # read_now answers b"" once released
        parts = []
        try:
            while chunk := await conn.next_chunk():
                parts.append(chunk)
        finally:
            self.release()
        return b"".join(parts)

    async def text(self) -> str:
        return (await self.read()).decode("utf-8", "replace")

    def release(self) -> None:
        """Done with the answer: a finished one's connection is kept for the next request, an unfinished one's closed."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._release(conn)


class Origin(NamedTuple):
    host: str
    port: int
    tls: bool


@lru_cache(maxsize=4096)
def origin(url: str) -> Origin:
    """The origin of an ``http://`` or ``https://`` URL; ``UpstreamError`` names anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"{url!r} is not an http:// or https:// address")
    tls = parts.scheme == "https"
    return Origin(parts.hostname, parts.port or (443 if tls else 80), tls)


def split_url(url: str) -> tuple[Origin, str]:
    """A full URL → its origin and the request target (path and query)."""
    parts = urlsplit(url)
    return origin(url), (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``headers`` as the request's header lines (``Name: value\\r\\n`` each), for :meth:`Upstreams.post`."""
    return "".join([f"{name}: {value}\r\n" for name, value in headers.items()]).encode("latin-1")


MAX_TARGETS = 4096
"""Targets (origin and path) whose request line is kept made; past it they are made afresh. Far above the
origins and paths a leader calls."""


class Upstreams:
    """Keep-alive connections to many upstreams, by origin."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._open_now: set[_Connection] = set()
        self._targets: dict[tuple[Origin, str], tuple[bytes, deque[_Connection]]] = {}
        """(origin, path) → the request's first lines and the origin's idle connections: one lookup per request."""
        self._tls: ssl.SSLContext | None = None
        self.opened = 0
        """Connections opened so far (a figure for tests and benchmarks)."""

    async def post(
        self,
        key: Origin,
        path: str,
        body: bytes,
        headers: Mapping[str, str] | bytes,
        on_sent: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send one POST to ``path`` at ``key`` and return once the answer's headers are in.

        ``headers`` as a mapping, or as header lines encoded already (:func:`header_lines`): a caller
        that sends the same ones again and again makes them once.

        ``on_sent`` is called each time the request has been written, while the upstream works on it:
        work that need not delay the request goes there.

        ``timeout``: seconds the whole exchange may take, from now until the answer is released (connecting
        included). Past it, the wait for the answer's head or for a piece of its body raises ``TimeoutError``
        and the connection is closed. It costs one timer, where ``asyncio.timeout`` around the exchange costs
        a context and a task's cancellation.

        Raises ``UpstreamError`` (a ``ConnectionError``) when the upstream cannot be reached or breaks off.
        """
        target = self._targets.get((key, path))
        if target is None:
            target = self._target(key, path)
        line, idle = target
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        request = b"".join(
            (
                line,
                headers if isinstance(headers, bytes) else header_lines(headers),
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        while True:
            if idle:
                conn = idle.pop()
                if conn.closed or conn.received:
                    self._discard(conn)  # closed by the upstream, or it spoke unasked while idle
                    continue
                reused = True
            else:
                conn = await self._open(key, idle, deadline)
                reused = False
            try:
                head = conn.start(request, deadline)
                if on_sent is not None:
                    on_sent()
                await head
            except UpstreamError:
                self._discard(conn)
                if reused and not conn.received:
                    continue  # closed while idle: the request was never read
                raise
            except BaseException:
                self._discard(conn)
                raise
            return UpstreamResponse(conn, self)

    def _target(self, key: Origin, path: str) -> tuple[bytes, deque[_Connection]]:
        """The request line and Host header for ``path`` at ``key``, made once as every request starts with them,
        and the origin's idle connections."""
        if len(self._targets) >= MAX_TARGETS:
            self._targets.clear()
        default = key.port == (443 if key.tls else 80)
        host = f"Host: {key.host if default else f'{key.host}:{key.port}'}\r\n".encode("idna")
        line = f"POST {path} HTTP/1.1\r\n".encode("latin-1") + host
        target = self._targets[key, path] = (line, self._idle.setdefault(key, deque()))
        return target

    async def _open(self, key: Origin, idle: deque[_Connection], deadline: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if key.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        connect_by = loop.time() + self.connect_timeout
        try:
            async with asyncio.timeout_at(connect_by if deadline is None else min(connect_by, deadline)):
                _, conn = await loop.create_connection(_Connection, key.host, key.port, ssl=tls)
        except TimeoutError:
            if deadline is not None and deadline <= connect_by:
                raise  # the exchange's own deadline
            raise UpstreamError(f"no connection to {key.host}:{key.port} within {self.connect_timeout:g}s") from None
        except OSError as err:
            raise UpstreamError(f"cannot connect to {key.host}:{key.port} ({err.strerror or err})") from None
        self.opened += 1
        self._open_now.add(conn)
        conn.home = idle
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        home = conn.home
        if home is None:
            return  # let go already
        # Kept when its answer is whole and read to its end, and the upstream keeps the connection open.
        if (
            conn.complete
            and conn.keep_alive
            and not conn.closed
            and not conn._buffered
            and conn.error is None
            and len(home) < IDLE_PER_HOST
        ):
            conn.received = False  # anything received from now on was not asked for
            home.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        self._open_now.discard(conn)
        conn.home = None
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        conn.transport.close()

    def idle(self, key: Origin) -> int:
        """Idle connections kept for one upstream."""
        return sum(1 for c in self._idle.get(key, ()) if not c.closed)

    async def close(self) -> None:
        for conn in list(self._open_now):
            self._discard(conn)
        self._idle.clear()
        self._targets.clear()
