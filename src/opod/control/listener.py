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

A call of ``/api`` without an ``Authorization`` header but with a session cookie is a person's
from the web (:mod:`opod.control.permits`): an ended session is refused 401, a change without its
session's CSRF token (``X-CSRF-Token``) 403, and a call the person's role and memberships do not
allow 403; it is audited with ``source: web`` and the person as the actor. The pages beside
``/api`` (sign-in, the console) take a form as well as JSON, and check their sessions themselves.
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
from opod.access.sessions import CSRF_HEADER, SESSION_COOKIE, SignedIn
from opod.control.audit import open_draft, record_after
from opod.control.permits import Operation, SessionGate
from opod.fleet.followers import EventSink
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


def form_content_type(value: str) -> bool:
    """True for a form a page posts (``application/x-www-form-urlencoded``)."""
    return value.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


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

    def __init__(
        self, app: ASGIApp, *, keys: KeyTable, store: Store, events: EventSink, sessions: SessionGate | None = None
    ) -> None:
        self.app = app
        self.keys = keys
        self.store = store
        self.events = events
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method: str = scope["method"]
        refused = self._refused(method, scope["path"], headers)
        person: SignedIn | None = None
        if refused is None and scope["path"].startswith("/api/"):
            refused, person = await self._caller(method, scope, headers)
        if refused is not None:
            await refused(scope, receive, send)
            if method not in _READS:
                await self._record_refused(scope, headers, refused.status_code, person)
            return
        if method in _READS:
            if person is not None and (denied := await self._denied(scope, person, b"")) is not None:
                await denied(scope, receive, send)
                return
            await self._read(scope, receive, send)
            return
        try:
            body = await _whole_body(headers, receive)
        except BodyTooLarge as err:
            await refusal(413, str(err))(scope, receive, send)
            await self._record_refused(scope, headers, 413, person)
            return
        request = Request(scope)
        actor = person.actor if person is not None else headers.get("x-llmgw-actor") or "unknown"
        try:
            if body.strip() and not form_content_type(headers.get("content-type", "")):
                json_value(body)  # a client's JSON rules (nesting, encodable text) before anything parses it
        except BadRequest as err:
            draft = open_draft(request, actor, b"", web=person is not None)
            draft.body = f"({len(body)} bytes refused: {err.message})"
            await refusal(400, err.message)(scope, receive, send)
            await record_after(self.store, request, draft, 400)
            return
        draft = open_draft(request, actor, body, web=person is not None)
        denied = await self._denied(scope, person, body) if person is not None else None
        if denied is not None:
            await denied(scope, receive, send)
            status = denied.status_code
            request = Request({**scope, **_routed(scope)})
        else:
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
        content_type = headers.get("content-type", "")
        page = not path.startswith("/api/")
        if method not in _READS and not (json_content_type(content_type) or (page and form_content_type(content_type))):
            form = " or application/x-www-form-urlencoded" if page else ""
            return refusal(415, f"{method} needs Content-Type: application/json{form} (even without a body)")
        actor = headers.get("x-llmgw-actor")
        if actor is not None and not ACTOR.fullmatch(actor):
            return refusal(
                400, "X-Llmgw-Actor: letters, digits and ._-@ only, at most 64 (who the change is recorded as made by)"
            )
        return None

    async def _caller(self, method: str, scope: Scope, headers: Headers) -> tuple[Response | None, SignedIn | None]:
        """Who calls ``/api``: the admin key (None), or a person's session; or why the call is refused."""
        cookie = Request(scope).cookies.get(SESSION_COOKIE)
        if headers.get("authorization") is None and cookie and self.sessions is not None:
            person = await self.sessions.sessions.find(cookie)
            if person is None:
                return refusal(401, "your session has ended (signed out or expired); sign in again at /signin"), None
            if method not in _READS and not person.csrf_ok(headers.get(CSRF_HEADER)):
                return refusal(
                    403, f"{CSRF_HEADER}: missing or not this session's; send the token the page (or /whoami) gave"
                ), person
            return None, person
        try:
            self.keys.check(headers.get("authorization"), kinds=("admin",))
        except Unauthorized as err:
            return refusal(401, err.message), None
        return None, None

    async def _denied(self, scope: Scope, person: SignedIn, body: bytes) -> Response | None:
        """A 403 ``ErrorView`` when the person may not make this call; None when they may (or no route matches)."""
        assert self.sessions is not None
        routed = _routed(scope)
        route = routed.get("route")
        operation_id = getattr(route, "operation_id", None)
        if route is None or not operation_id:
            return None  # answered 404 or 405 by the app
        tags = getattr(route, "tags", None) or [""]
        query = {k: v for k, v in Request(scope).query_params.items()}
        call = Operation(operation_id, str(tags[0]), scope["method"], routed.get("path_params", {}), query, body)
        refused = await self.sessions.check(person, call)
        return None if refused is None else refusal(refused.status, refused.message)

    async def _record_refused(self, scope: Scope, headers: Headers, status: int, person: SignedIn | None) -> None:
        """A change refused here, before its route ran, is in the audit as its route would record it, without its
        body (never read, or not whole)."""
        actor = person.actor if person is not None else headers.get("x-llmgw-actor") or "unknown"
        request = Request({**scope, **_routed(scope)})
        draft = open_draft(request, actor if ACTOR.fullmatch(actor) else "unknown", b"", web=person is not None)
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
