"""The hot routes' short way through uvicorn answers exactly as the usual way does, on a real socket."""

from __future__ import annotations

import asyncio
import json

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from opod.http.fastpath import (
    BODY_LIMIT,
    FastHttpProtocol,
    FastPath,
    PreparedResponse,
    ReadRequest,
    headers_of,
    read_whole,
    uvicorn_seam_problems,
)
from opod.http.serving import Listener, bind, serve


def way(request: Request) -> str:
    """Which way the request came: the short way hands over a request read whole."""
    return "short" if isinstance(request, ReadRequest) else "usual"


class App:
    """A FastPath app: ``POST /echo`` and ``POST /stream`` are hot; ``/cold`` is not. Handlers record how they ran."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stream_closed = asyncio.Event()
        self.release = asyncio.Event()
        self.slow_started = asyncio.Event()
        self.slow_ended: asyncio.Future[str] | None = None

    async def echo(self, request: Request) -> Response:
        body = await request.body()
        self.calls.append(way(request))
        if body == b"boom":
            raise RuntimeError("handler failed")
        return JSONResponse(
            {
                "len": len(body),
                "sum": sum(body) % 997,
                "id": request.headers.get("x-request-id"),
                "query": request.url.query,
            },
            headers={"X-Seen": "yes"},
        )

    async def prepared(self, request: Request) -> Response:
        """Reads the way the gateway does: the headers as one dictionary, the body handed over when read whole."""
        self.calls.append(way(request))
        whole = read_whole(request)
        body = whole if whole is not None else await request.body()
        tag = headers_of(request).get(b"x-tag", b"none")
        return PreparedResponse(
            body[::-1], 201, [(b"x-first-tag", tag), (b"content-type", b"application/octet-stream")]
        )

    async def stream(self, request: Request) -> Response:
        self.calls.append(way(request))

        async def pieces():
            try:
                yield b"data: 1\n\n"
                await self.release.wait()
                yield b"data: 2\n\n"
            finally:
                self.stream_closed.set()

        return StreamingResponse(pieces(), media_type="text/event-stream")

    async def slow(self, request: Request) -> Response:
        """A whole answer that takes long to make (an engine generating): it records how its wait ended."""
        await request.body()
        self.calls.append(way(request))
        self.slow_ended = asyncio.get_running_loop().create_future()
        self.slow_started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            if not self.slow_ended.done():
                self.slow_ended.set_result("cancelled")
            raise
        self.slow_ended.set_result("answered")
        return JSONResponse({"done": True})

    def asgi(self) -> FastPath:
        async def cold(request: Request) -> Response:
            return JSONResponse({"cold": True})

        hot = {("POST", "/echo"): self.echo, ("POST", "/stream"): self.stream, ("POST", "/prepared"): self.prepared}
        hot[("POST", "/slow")] = self.slow
        return FastPath(hot, Starlette(routes=[Route("/cold", cold, methods=["GET"])]))


@pytest.fixture
async def served():
    app = App()
    sock = bind("127.0.0.1", 0, "test listener")
    stop = asyncio.Event()
    task = asyncio.create_task(serve([Listener(app.asgi(), sock, "test")], stop))
    await asyncio.sleep(0.05)
    yield app, sock.getsockname()[1]
    stop.set()
    await task


async def exchange(port: int, raw: bytes, answers: int = 1) -> tuple[list[tuple[bytes, dict, bytes]], bool]:
    """Send raw bytes on one connection; read ``answers`` responses; also say whether the server then closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    out = []
    for _ in range(answers):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        if head.startswith(b"HTTP/1.1 100 "):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                piece = await reader.readexactly(size + 2)
                if size == 0:
                    break
                body += piece[:-2]
        out.append((lines[0].encode(), headers, body))
    try:
        closed = await asyncio.wait_for(reader.read(1), 0.3) == b""
    except TimeoutError:
        closed = False
    writer.close()
    return out, closed


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_hot_and_usual_ways_answer_alike(served):
    app, port = served
    body = bytes(range(256)) * 40
    (short,), _ = await exchange(port, post("/echo?x=1", body, "X-Request-Id: r-1"))
    # Expect: 100-continue sends the same request the usual way.
    (usual,), _ = await exchange(port, post("/echo?x=1", body, "X-Request-Id: r-1", "Expect: 100-continue"))
    assert short[0] == usual[0] == b"HTTP/1.1 200 OK"
    assert short[1] == usual[1]
    assert short[2] == usual[2]
    assert json.loads(short[2]) == {"len": len(body), "sum": sum(body) % 997, "id": "r-1", "query": "x=1"}
    assert short[1]["x-seen"] == "yes" and app.calls == ["short", "usual"]


async def test_prepared_answers_and_header_maps_alike_both_ways(served):
    app, port = served
    body = b"0123456789" * 100
    tags = ("X-Tag: first", "X-Tag: second")
    (short,), _ = await exchange(port, post("/prepared", body, *tags))
    (usual,), _ = await exchange(port, post("/prepared", body, *tags, "Expect: 100-continue"))
    assert app.calls == ["short", "usual"]
    assert short[0] == usual[0] == b"HTTP/1.1 201 Created"
    assert short[2] == usual[2] == body[::-1]
    for _, headers, _ in (short, usual):
        # A repeated header reads as its first value, as Starlette's Headers.get has it.
        assert headers["x-first-tag"] == "first"
        assert headers["content-length"] == str(len(body)) and headers["content-type"] == "application/octet-stream"


async def test_keep_alive_pipelining_and_close(served):
    app, port = served
    # Two pipelined requests and a cold one, on one connection, answered in order; then Connection: close.
    raw = (
        post("/echo", b"a")
        + post("/echo", b"bb")
        + b"GET /cold HTTP/1.1\r\nHost: t\r\n\r\n"
        + post("/echo", b"ccc", "Connection: close")
    )
    answers, closed = await exchange(port, raw, answers=4)
    assert [json.loads(b).get("len", "cold") for _, _, b in answers] == [1, 2, "cold", 3]
    assert answers[3][1].get("connection") == "close" and closed
    # The first request goes the short way; the ones queued behind it wait the usual way.
    assert app.calls[0] == "short"


async def test_large_body_takes_the_usual_way_whole(served):
    app, port = served
    body = b"x" * (BODY_LIMIT + 10)
    (answer,), _ = await exchange(port, post("/echo", body))
    assert json.loads(answer[2])["len"] == len(body) and app.calls == ["usual"]


async def test_stream_is_chunked_and_a_leaving_client_closes_it(served):
    app, port = served
    app.release.set()
    (answer,), _ = await exchange(port, post("/stream", b"{}"))
    assert answer[1]["transfer-encoding"] == "chunked" and answer[1]["content-type"].startswith("text/event-stream")
    assert answer[2] == b"data: 1\n\ndata: 2\n\n" and app.calls == ["short"]

    app.release.clear()
    app.stream_closed.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post("/stream", b"{}"))
    await asyncio.wait_for(reader.readuntil(b"data: 1\n\n"), 5)
    writer.close()  # the client leaves while the stream waits for its next piece
    await asyncio.wait_for(app.stream_closed.wait(), 5)


@pytest.mark.parametrize("route", ["short", "usual"])
async def test_a_client_that_leaves_before_a_whole_answer_cancels_its_handler(served, route: str):
    """Not only streams: a whole answer's handler (a relay waiting on an engine) is cancelled when its client
    hangs up, so the engine's request is closed too. The usual way is taken by a chunked body."""
    app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if route == "short":
        writer.write(post("/slow", b"{}"))
    else:
        head = "POST /slow HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head.encode() + b"2\r\n{}\r\n0\r\n\r\n")
    await asyncio.wait_for(app.slow_started.wait(), 5)
    writer.close()  # the client hangs up while the handler waits
    assert app.slow_ended is not None
    assert await asyncio.wait_for(app.slow_ended, 5) == "cancelled"
    assert app.calls == [route]


async def test_failing_handler_gets_500_and_a_closed_connection(served):
    app, port = served
    (answer,), closed = await exchange(port, post("/echo", b"boom"))
    assert answer[0] == b"HTTP/1.1 500 Internal Server Error" and answer[2] == b"Internal Server Error"
    assert closed


async def test_a_chunked_body_takes_the_usual_way_and_the_next_request_the_short_one(served):
    app, port = served
    chunked = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    answers, _ = await exchange(port, chunked + post("/echo", b"abcde") + post("/echo?q=2", b"abcde"), answers=3)
    assert [json.loads(body) for _, _, body in answers] == [
        {"len": 5, "sum": sum(b"abcde") % 997, "id": None, "query": query} for query in ("", "", "q=2")
    ]
    assert app.calls[0] == "usual"
    (again,), _ = await exchange(port, post("/echo", b"abcde"))  # the target known from before, on a new connection
    assert json.loads(again[2])["len"] == 5 and app.calls[-1] == "short"


def test_the_uvicorn_internals_the_short_way_reads_are_still_there():
    problems = uvicorn_seam_problems()
    assert not problems, (
        f"uvicorn {uvicorn.__version__} changed what opod.http.fastpath reads of it (UVICORN_INTERNALS): "
        + "; ".join(problems)
        + ". Pin uvicorn to a tested version or follow the change in fastpath."
    )


def test_a_missing_uvicorn_internal_is_named_with_uvicorn_s_version(monkeypatch):
    from opod.http import fastpath

    moved = {**fastpath.UVICORN_INTERNALS, "attributes": ("parser", "renamed_state")}
    monkeypatch.setattr(fastpath, "UVICORN_INTERNALS", moved)
    assert uvicorn_seam_problems() == [
        f"uvicorn {uvicorn.__version__}: HttpToolsProtocol no longer sets self.renamed_state"
    ]


def test_a_request_read_whole_has_starlette_s_own_fields_and_answers_as_one():
    scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": [(b"x-a", b"1"), (b"x-a", b"2")]}
    read, plain = ReadRequest(scope, b'{"a":1}'), Request(scope)
    assert set(vars(plain)) <= set(vars(read)), "Starlette's Request has fields ReadRequest does not set"
    assert (read.method, read.url.path, read.headers.getlist("x-a")) == ("POST", "/v1/x", ["1", "2"])
    assert asyncio.run(read.body()) == b'{"a":1}' and asyncio.run(read.json()) == {"a": 1}
    assert headers_of(read) == {b"x-a": b"1"}


def test_a_prepared_answer_is_framed_as_starlette_frames_one():
    # No content-length where HTTP has no body (1xx, 204, 304), as Starlette's own Response has it.
    for status, body in ((200, b'{"a":1}'), (201, b""), (404, b"no"), (204, b""), (304, b""), (101, b"")):
        extra = [(b"x-a", b"1"), (b"content-type", b"application/json")]
        prepared = PreparedResponse(body, status, extra)
        expected = Response(body, status)
        expected.raw_headers += extra
        assert (prepared.status_code, prepared.body, prepared.raw_headers, prepared.background) == (
            expected.status_code,
            expected.body,
            expected.raw_headers,
            expected.background,
        ), status
        assert prepared.headers["x-a"] == "1"


@pytest.fixture
def short_keep_alive(monkeypatch):
    """Connections kept alive 0.4 s when idle (uvicorn's default is 5 s)."""
    made = FastHttpProtocol.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.timeout_keep_alive = 0.4

    monkeypatch.setattr(FastHttpProtocol, "__init__", init)


async def answer_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> dict:
    writer.write(post("/echo", body))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1]
    )
    return json.loads(await reader.readexactly(length))


async def test_an_idle_connection_is_closed_after_the_keep_alive_time_and_a_busy_one_is_not(short_keep_alive, served):
    _, port = served
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # Busy for about three keep-alive times, a request every 0.1 s: the timer armed after the first answer
    # fires while the connection is in use, and the connection stays open.
    began = last = loop.time()
    while last - began < 1.2:
        assert (await answer_on(reader, writer, b"abc"))["len"] == 3
        last = loop.time()
        await asyncio.sleep(0.1)
    # Then idle: closed once the keep-alive time has passed since its last answer, not before.
    assert await asyncio.wait_for(reader.read(1), 3) == b""
    idle = loop.time() - last
    assert 0.35 <= idle < 1.2, f"closed {idle:.2f}s after its last answer, not about 0.4s"
    writer.close()


async def test_a_request_in_progress_is_not_cut_by_the_keep_alive_timer(short_keep_alive, served):
    app, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert (await answer_on(reader, writer, b"x"))["len"] == 1  # arms the timer
    writer.write(post("/slow", b"{}"))
    await asyncio.wait_for(app.slow_started.wait(), 5)
    await asyncio.sleep(0.9)  # past two keep-alive times while the answer is being made
    app.release.set()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    assert app.slow_ended is not None and app.slow_ended.result() == "answered"
    writer.close()
