"""The relay's HTTP/1.1 client against real loopback servers that answer in each way an upstream can."""

from __future__ import annotations

import asyncio

import pytest

from opod.http.upstream import Origin, UpstreamError, Upstreams, origin, split_url


class Server:
    """A loopback HTTP server whose answer to each request is scripted; it counts connections and keeps requests."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.readers: list[asyncio.StreamReader] = []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.origin = Origin("127.0.0.1", self.port, False)
        return self

    async def __aexit__(self, *exc) -> None:
        for w in self.writers:
            w.close()
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        self.readers.append(reader)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if await self.answer(request, writer) == "close":
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def raw(data: bytes, then: str | None = None):
    """An answer that writes ``data`` as it is, then closes the connection when ``then`` is "close"."""

    async def answer(request, writer):
        writer.write(data)
        await writer.drain()
        return then

    return answer


def plain(body: bytes, status: str = "200 OK", content_type: str = "application/json"):
    return raw(
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )


async def test_answer_with_length_and_kept_connection():
    async with Server(plain(b'{"ok":true}')) as server:
        pool = Upstreams()
        for _ in range(3):
            resp = await pool.post(server.origin, "/v1/chat/completions", b'{"a":1}', {"X-Request-Id": "r1"})
            assert (resp.status, resp.content_type) == (200, "application/json")
            assert await resp.read() == b'{"ok":true}'
        assert server.connections == 1 and pool.opened == 1
        first = server.requests[0]
        assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first
        assert b"X-Request-Id: r1\r\n" in first and first.endswith(b'\r\n\r\n{"a":1}')
        await pool.close()


def in_two_parts(first: bytes, rest: bytes):
    """An answer that writes ``first``, then ``rest`` once the returned event is set."""
    release = asyncio.Event()

    async def answer(request, writer):
        writer.write(first)
        await writer.drain()
        await release.wait()
        writer.write(rest)
        await writer.drain()

    return answer, release


async def test_chunked_stream_arrives_piece_by_piece():
    answer, release = in_two_parts(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata: 1\n\r\n",
        b"8\r\ndata: 2\n\r\n0\r\n\r\n",
    )
    async with Server(answer) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/s", b"{}", {})
        assert resp.content_type == "text/event-stream"
        assert await resp.readany() == b"data: 1\n"
        release.set()
        assert await resp.readany() == b"data: 2\n"
        assert await resp.readany() == b""
        resp.release()
        assert pool.idle(server.origin) == 1
        await pool.close()


async def test_a_kept_connection_reads_chunked_and_sized_answers_in_turn():
    async def answer(request, writer):
        if b"/chunked" in request.split(b"\r\n", 1)[0]:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kind: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            )
        else:
            writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-Kind: sized\r\n\r\nok")
        await writer.drain()

    async with Server(answer) as server:
        pool = Upstreams()
        for path, status, kind, body in [("/chunked", 200, "chunked", b"abc"), ("/sized", 201, "sized", b"ok")] * 2:
            resp = await pool.post(server.origin, path, b"{}", {})
            assert (resp.status, resp.headers.get("x-kind"), await resp.read()) == (status, kind, body)
        assert server.connections == 1 and pool.opened == 1
        await pool.close()


async def test_an_answer_already_in_is_taken_at_once_and_its_connection_kept():
    async with Server(plain(b'{"ok":true}')) as server:
        pool = Upstreams()
        for _ in range(3):
            resp = await pool.post(server.origin, "/", b"{}", {})
            for _ in range(100):  # the body may come in a packet after the headers
                if resp._conn is None or resp._conn.complete:
                    break
                await asyncio.sleep(0.01)
            assert resp.read_now() == b'{"ok":true}'
            assert resp.read_now() == b"" and await resp.read() == b""  # taken: nothing is left
        assert server.connections == 1 and pool.idle(server.origin) == 1
        await pool.close()


async def test_an_answer_still_coming_is_not_taken_at_once():
    answer, release = in_two_parts(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", b"cd")
    async with Server(answer) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"{}", {})
        assert resp.read_now() is None
        release.set()
        assert await resp.read() == b"abcd"
        assert pool.idle(server.origin) == 1
        await pool.close()


async def test_unfinished_answer_released_closes_its_connection():
    async with Server(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"", {})
        assert await resp.readany() == b"partial"
        resp.release()
        assert pool.idle(server.origin) == 0
        await pool.close()


async def test_a_whole_answer_whose_reader_is_cancelled_closes_its_connection():
    """A relay waiting on a whole answer whose client left is cancelled: the upstream sees the connection
    close (an engine stops generating for a closed connection), and it is not kept for the next request."""
    closed = asyncio.Event()

    async def never_finishes(request, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        await server.readers[-1].read()  # b"" once the client has closed the connection
        closed.set()
        return "close"

    async with Server(never_finishes) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"", {})
        reading = asyncio.create_task(resp.read())
        await asyncio.sleep(0.05)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await asyncio.wait_for(closed.wait(), 5)
        assert pool.idle(server.origin) == 0
        await pool.close()


async def test_on_sent_runs_while_the_upstream_works_on_the_request():
    # The upstream answers only once on_sent has run: a pool that called it after the answer would hang.
    called = asyncio.Event()
    answer = plain(b"ok")

    async def after_on_sent(request, writer):
        await called.wait()
        return await answer(request, writer)

    calls = []

    def on_sent():
        calls.append(len(server.requests))
        called.set()

    async with Server(after_on_sent) as server:
        pool = Upstreams()
        resp = await asyncio.wait_for(pool.post(server.origin, "/", b'{"a":1}', {}, on_sent=on_sent), 5)
        assert await resp.read() == b"ok"
        assert calls == [0], "on_sent runs once, before the upstream has even read the request"
        await pool.close()


async def test_idle_connection_closed_by_the_upstream_is_replaced():
    # Closed after the answer without saying Connection: close, as an idle timeout does.
    async with Server(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", then="close")) as server:
        pool = Upstreams()
        assert await (await pool.post(server.origin, "/", b"", {})).read() == b"ok"
        await asyncio.sleep(0.05)
        assert await (await pool.post(server.origin, "/", b"", {})).read() == b"ok"
        assert server.connections == 2
        await pool.close()


async def test_upstream_breaking_off_mid_answer_is_a_connection_error():
    async with Server(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhalf", then="close")) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"", {})
        with pytest.raises(UpstreamError, match="closed the connection"):
            await resp.read()
        await pool.close()


async def test_refused_connection_and_garbage_are_connection_errors():
    pool = Upstreams()
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(ConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
        await pool.post(Origin("127.0.0.1", port, False), "/", b"", {})

    async with Server(raw(b"SSH-2.0-OpenSSH\r\n\r\n")) as server:
        with pytest.raises(UpstreamError, match="not valid HTTP/1.1"):
            await pool.post(server.origin, "/", b"", {})
    await pool.close()


async def test_slow_reader_pauses_the_upstream_and_gets_every_byte():
    body = bytes(range(256)) * 16 * 1024  # 4 MiB, past the pause threshold

    async with Server(plain(body, content_type="application/octet-stream")) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"", {})
        await asyncio.sleep(0.2)  # let it pile up unread
        assert await resp.read() == body
        await pool.close()


def test_origins_and_targets():
    assert origin("http://127.0.0.1:8081") == Origin("127.0.0.1", 8081, False)
    assert origin("https://api.example.com") == Origin("api.example.com", 443, True)
    assert split_url("https://api.example.com/v1/chat/completions?x=1") == (
        Origin("api.example.com", 443, True),
        "/v1/chat/completions?x=1",
    )
    with pytest.raises(UpstreamError, match="not an http:// or https://"):
        origin("ftp://host/")


async def test_an_idle_connection_the_upstream_spoke_on_unasked_is_not_reused():
    # An answer, then later an unasked one (as a server's idle timeout may send a 408) on the open connection.
    async def answer(request, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 7\r\n\r\ntimeout")
        await writer.drain()

    async with Server(answer) as server:
        pool = Upstreams()
        for _ in range(2):
            resp = await pool.post(server.origin, "/", b"", {})
            assert (resp.status, await resp.read()) == (200, b"ok")
            await asyncio.sleep(0.1)
        assert server.connections == 2
        await pool.close()


async def test_a_timeout_ends_an_exchange_waiting_for_its_head_or_its_body():
    async def silent(request, writer):
        await asyncio.sleep(10)

    async with Server(silent) as server:
        pool = Upstreams()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await pool.post(server.origin, "/", b"", {}, timeout=0.2)
        assert 0.15 < loop.time() - started < 2 and pool.idle(server.origin) == 0
        await pool.close()

    async with Server(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"", {}, timeout=0.2)
        with pytest.raises(TimeoutError):
            await resp.read()
        assert pool.idle(server.origin) == 0
        for _ in range(100):  # the server sees the connection closed
            if server.writers[-1].is_closing():
                break
            await asyncio.sleep(0.01)
        assert server.writers[-1].is_closing()
        await pool.close()


async def test_an_exchange_done_in_time_keeps_its_connection_past_its_timeout():
    async with Server(plain(b"ok")) as server:
        pool = Upstreams()
        for _ in range(2):
            resp = await pool.post(server.origin, "/", b"", {}, timeout=0.1)
            assert await resp.read() == b"ok"
            await asyncio.sleep(0.2)
            assert pool.idle(server.origin) == 1
        assert server.connections == 1
        await pool.close()


async def test_headers_read_alike_whatever_the_case_of_their_names():
    answer = raw(
        b"HTTP/1.1 200 OK\r\ncontent-type: Text/Plain; charset=utf-8\r\nX-Upper: A\r\nContent-Length: 2\r\n\r\nok"
    )
    async with Server(answer) as server:
        pool = Upstreams()
        resp = await pool.post(server.origin, "/", b"", {})
        assert resp.content_type == "text/plain"
        assert resp.headers == {"content-type": "Text/Plain; charset=utf-8", "x-upper": "A", "content-length": "2"}
        assert await resp.read() == b"ok"
        await pool.close()
