"""The admin listener's own checks, in front of every route of ``/api/v1``: an ASGI middleware.

Before the key is looked at, the listener refuses a ``Host`` that is a name rather than an
address or ``localhost`` (a DNS-rebinding page), a request another site's page sent
(``Sec-Fetch-Site`` other than same-origin or none, an ``Origin`` other than the listener's own),
and any method but GET and HEAD whose ``Content-Type`` is not JSON (``application/json``, any
case, parameters such as ``charset`` allowed), a missing one included (a cross-site form).
Every path under ``/api``, ``openapi.json`` included, needs the admin key. A body is read whole
before any route sees it, refused past :data:`MAX_BODY` whether or not ``Content-Length`` said its
size, and held to a client's JSON rules (``opod.http.inbound.json_value``: nesting, encodable text). HEAD is answered as GET without the body. ``X-Llmgw-Actor`` names who made a
change: letters, digits and ``._-@``, at most 64; ``unknown`` when absent.

A change (any method but GET and HEAD) gets its audit draft before its route runs; once it has
answered, the listener records the draft unless the change committed it
(:mod:`opod.control.audit`), and emits ``admin.call``. A change the listener refuses itself is
recorded too, with its refusal's status and without its body.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from opod.access.keytable import KeyTable
from opod.control.audit import open_draft, record_after
from opod.control.context import EventSink
from opod.http.errors import BadRequest, Unauthorized
from opod.http.inbound import json_value
from opod.store import Store

log = logging.getLogger("opod.control")

ACTOR = re.compile(r"[A-Za-z0-9._@-]{1,64}")
"""``X-Llmgw-Actor``: who a change is recorded as made by."""
MAX_BODY = 8 * 1024 * 1024
"""The largest body a management API call may send."""
_READS = ("GET", "HEAD")


def refusal(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The spec's ``ErrorView``: every refusal and error of the admin listener."""
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers) if headers else None)


def json_content_type(value: str) -> bool:
    """True for ``application/json`` as a media type, in any case, with or without parameters."""
    return value.split(";", 1)[0].strip().lower() == "application/json"


def cross_site(headers: Headers) -> str:
    """Why the request looks sent by another site's page, or ``""``."""
    fetch_site = headers.get("sec-fetch-site", "")
    if fetch_site and fetch_site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site: {fetch_site}"
    origin = headers.get("origin")
    if origin is not None:
        netloc = origin.split("://", 1)[1] if "://" in origin else ""
        if origin == "null" or netloc.rstrip("/") != headers.get("host", ""):
            return f"Origin: {origin}"
    return ""


def host_ok(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
    if name in ("localhost", ""):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class BodyTooLarge(Exception):
    """A body past :data:`MAX_BODY`, found while reading it."""


class AdminGuard:
    """The listener's checks around the admin app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, *, keys: KeyTable, store: Store, events: EventSink) -> None:
        self.app = app
        self.keys = keys
        self.store = store
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method: str = scope["method"]
        refused = self._refused(method, scope["path"], headers)
        if refused is not None:
            await refused(scope, receive, send)
            if method not in _READS:
                await self._record_refused(scope, headers, refused.status_code)
            return
        if method in _READS:
            await self._read(scope, receive, send)
            return
        try:
            body = await _whole_body(headers, receive)
        except BodyTooLarge as err:
            await refusal(413, str(err))(scope, receive, send)
            await self._record_refused(scope, headers, 413)
            return
        request = Request(scope)
        actor = headers.get("x-llmgw-actor") or "unknown"
        try:
            if body.strip():  # a client's JSON rules (nesting, encodable text) before anything parses it
                json_value(body)
        except BadRequest as err:
            draft = open_draft(request, actor, b"")
            draft.body = f"({len(body)} bytes refused: {err.message})"
            await refusal(400, err.message)(scope, receive, send)
            await record_after(self.store, request, draft, 400)
            return
        draft = open_draft(request, actor, body)
        status = await self._answer(scope, _replay(body, receive), send)
        self.events("admin.call", scope["path"], {"method": method, "status": status, "actor": draft.actor})
        await record_after(self.store, request, draft, status)

    def _refused(self, method: str, path: str, headers: Headers) -> Response | None:
        if not host_ok(headers.get("host", "")):
            return refusal(403, "the admin listener answers only requests addressed to an IP address or localhost")
        if why := cross_site(headers):
            return refusal(
                403,
                f"the admin listener refuses requests another site's page sent ({why}); call it from a script or opod ctl",
            )
        if method not in _READS and not json_content_type(headers.get("content-type", "")):
            return refusal(415, f"{method} needs Content-Type: application/json (even without a body)")
        actor = headers.get("x-llmgw-actor")
        if actor is not None and not ACTOR.fullmatch(actor):
            return refusal(
                400, "X-Llmgw-Actor: letters, digits and ._-@ only, at most 64 (who the change is recorded as made by)"
            )
        if path.startswith("/api/"):
            try:
                self.keys.check(headers.get("authorization"), kinds=("admin",))
            except Unauthorized as err:
                return refusal(401, err.message)
        return None

    async def _record_refused(self, scope: Scope, headers: Headers, status: int) -> None:
        """A change refused here, before its route ran, is in the audit as its route would record it, without its
        body (never read, or not whole)."""
        actor = headers.get("x-llmgw-actor") or "unknown"
        request = Request({**scope, **_routed(scope)})
        draft = open_draft(request, actor if ACTOR.fullmatch(actor) else "unknown", b"")
        await record_after(self.store, request, draft, status)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> None:
        """GET as it is; HEAD as GET with the headers alone (``Content-Length`` still the body's)."""
        if scope["method"] != "HEAD":
            await self._answer(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self._answer({**scope, "method": "GET"}, receive, headers_only)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> int:
        """Run the app; its status, or a 500 ``ErrorView`` (the leader's log says why) when it failed before answering."""
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception("%s %s failed", scope["method"], scope["path"])
            if status:  # the answer has begun: the client sees it cut off
                raise
            status = 500
            failed = refusal(500, f"{scope['method']} {scope['path']} failed on the leader; its log says why")
            await failed(scope, receive, send)
        return status


async def _whole_body(headers: Headers, receive: Receive) -> bytes:
    """The request's body, refused past :data:`MAX_BODY` as soon as it is known to be: by its ``Content-Length``, or
    while reading a body that did not say its size."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise BodyTooLarge(
            f"the body is {int(declared)} bytes; the management API takes at most {MAX_BODY} (split the change)"
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyTooLarge(f"the body is over {MAX_BODY} bytes; the management API takes at most that (split it)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _routed(scope: Scope) -> dict[str, Any]:
    """What routing adds to this request's scope (its ``route`` and ``path_params``), or nothing: then the audit
    row names the path as sent."""
    for route in _routes(getattr(scope.get("app"), "routes", ())):
        match, child = route.matches(scope)
        if match is Match.FULL:
            return dict(child)
    return {}


def _routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, those of included routers too (FastAPI may keep an included router whole, as one route)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _routes(included.routes)
        else:
            yield route


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then whatever the connection says next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
