"""Pooled HTTP/1.1 connections for relaying ``/v1`` requests: leader to workers and engines, worker to engines.

A relay sends one POST and passes the answer on, whole or as it comes; it needs
no cookies, redirects or decompression. A protocol on the event loop with
httptools' parser does just that, with less CPU per relayed request than
aiohttp's client (the routing bench compares them; figures in ``bench/results/``).

Connections are kept alive per origin (host, port, TLS or not) and reused last-in first-out. A
reused connection that the other side had already closed (an idle timeout) is
found before anything is read from it, and the request is sent again on a new
one: nothing of it can have been processed. Every failure is a
``ConnectionError``, so callers treat it like any other network error.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Mapping
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
        "closed",
        "error",
        "headers",
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
        # One parser for the connection's life: after a whole answer it waits for the next one.
        self.parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.headers: dict[str, str] = {}
        self.status = 0
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head: asyncio.Future[None] | None = None
        self.complete = False
        self.keep_alive = False
        self.received = False
        self._paused = False

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one in all but its class
        self._loop = asyncio.get_running_loop()  # asked once: each ask costs a getpid() system call

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamError(f"the upstream's answer is not valid HTTP/1.1 ({err})"))
            self.transport.close()

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

    # -- httptools callbacks --------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_AT and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- the caller's side ----------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, err: Exception) -> None:
        if self.error is None:
            self.error = err
        for future in (self._head, self._waiter):
            if future is not None and not future.done():
                future.set_exception(err)

    async def send(self, request: bytes, on_sent: Callable[[], None] | None) -> None:
        """Write ``request``, call ``on_sent``, and wait for the answer's status line and headers."""
        self._head = self._loop.create_future()
        self.transport.write(request)
        if on_sent is not None:
            on_sent()
        await self._head

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

    def take_whole(self) -> bytes | None:
        """The whole body when all of it has arrived and nothing of it was taken yet, else ``None``."""
        if not self.complete or self.error is not None or self._paused:
            return None
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._chunks and self.error is None


class UpstreamResponse:
    """An answer being received: status and headers now, the body by ``read`` or ``readany``."""

    __slots__ = ("status", "headers", "_conn", "_pool")

    def __init__(self, conn: _Connection, pool: Upstreams) -> None:
        self.status = conn.status
        self.headers = conn.headers
        """Header names in lower case; a repeated header keeps its last value."""
        self._conn: _Connection | None = conn
        self._pool = pool

    @property
    def content_type(self) -> str:
        """The media type without parameters, or ``""`` when the upstream named none."""
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    async def readany(self) -> bytes:
        """The next piece of the body as it arrived; ``b""`` at its end."""
        if self._conn is None:
            return b""
        return await self._conn.next_chunk()

    def read_now(self) -> bytes | None:
        """The whole body when all of it has arrived already (the connection goes back to the pool), else ``None``.

        A short answer usually comes in the packet with its headers; taking it here spares the
        awaits of :meth:`read`.
        """
        conn = self._conn
        if conn is None:
            return b""
        data = conn.take_whole()
        if data is not None:
            self.release()
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


class Upstreams:
    """Keep-alive connections to many upstreams, by origin."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._keys: dict[_Connection, Origin] = {}
        self._heads: dict[Origin, bytes] = {}
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
    ) -> UpstreamResponse:
        """Send one POST to ``path`` at ``key`` and return once the answer's headers are in.

        ``headers`` as a mapping, or as header lines encoded already (:func:`header_lines`): a caller
        that sends the same ones again and again makes them once.

        ``on_sent`` is called each time the request has been written, while the upstream works on it:
        work that need not delay the request goes there.

        Raises ``UpstreamError`` (a ``ConnectionError``) when the upstream cannot be reached or breaks off.
        """
        head = self._heads.get(key)
        if head is None:
            default = key.port == (443 if key.tls else 80)
            head = self._heads[key] = f"Host: {key.host if default else f'{key.host}:{key.port}'}\r\n".encode("idna")
        request = b"".join(
            (
                f"POST {path} HTTP/1.1\r\n".encode("latin-1"),
                head,
                headers if isinstance(headers, bytes) else header_lines(headers),
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.closed:
                self._forget(conn)
                continue
            conn._reset()
            try:
                await conn.send(request, on_sent)
            except UpstreamError:
                self._discard(conn)
                if conn.received:
                    raise
                continue  # closed while idle: the request was never read
            except BaseException:
                self._discard(conn)
                raise
            return UpstreamResponse(conn, self)
        conn = await self._open(key)
        try:
            await conn.send(request, on_sent)
        except BaseException:
            self._discard(conn)
            raise
        return UpstreamResponse(conn, self)

    async def _open(self, key: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if key.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(_Connection, key.host, key.port, ssl=tls)
        except TimeoutError:
            raise UpstreamError(f"no connection to {key.host}:{key.port} within {self.connect_timeout:g}s") from None
        except OSError as err:
            raise UpstreamError(f"cannot connect to {key.host}:{key.port} ({err.strerror or err})") from None
        self.opened += 1
        self._keys[conn] = key
        return conn

    def _release(self, conn: _Connection) -> None:
        key = self._keys.get(conn)
        if key is None:
            return
        if not conn.reusable():
            self._discard(conn)
            return
        idle = self._idle.setdefault(key, deque())
        if len(idle) >= IDLE_PER_HOST:
            self._discard(conn)
            return
        idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        self._forget(conn)
        conn.transport.close()

    def _forget(self, conn: _Connection) -> None:
        self._keys.pop(conn, None)

    def idle(self, key: Origin) -> int:
        """Idle connections kept for one upstream."""
        return sum(1 for c in self._idle.get(key, ()) if not c.closed)

    async def close(self) -> None:
        for conn in list(self._keys):
            self._discard(conn)
        self._idle.clear()
