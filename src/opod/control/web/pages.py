"""What every page of the web shares: its templates, the signed-in person, the CSRF check, the cookie, the answers.

A page handler asks :meth:`WebSessions.person` for the request's person (None when signed out),
:meth:`WebSessions.change` for a change (the person, refused without the session's CSRF token),
and :class:`opod.access.permissions.Permissions` what that person may do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from opod.access.sessions import CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE, NewSession, Sessions, SignedIn
from opod.control.listener import form_content_type
from opod.store.audit import SOURCE_WEB, AuditDraft

TEMPLATES = Environment(
    loader=PackageLoader("opod.control.web", "templates"),
    autoescape=select_autoescape(default=True),
    auto_reload=False,
)


class PageRefused(Exception):
    """A page's refusal with its status: the JSON ``ErrorView``, or the page again with the message."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


class WebSessions:
    """The signed-in person of a page's request, and the check every change made with a session passes."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def person(self, request: Request) -> SignedIn | None:
        return await self.sessions.find(request.cookies.get(SESSION_COOKIE))

    async def change(self, request: Request, form: Mapping[str, Any] | None = None) -> SignedIn:
        """The person making a change: 401 without a live session, 403 without its CSRF token (header or field)."""
        person = await self.person(request)
        if person is None:
            raise PageRefused(401, "you are not signed in (or your session ended); sign in at /signin")
        web_draft(request).actor = person.actor
        given = request.headers.get(CSRF_HEADER) or str((form or {}).get(CSRF_FIELD, ""))
        if not person.csrf_ok(given):
            raise PageRefused(403, f"{CSRF_HEADER}: missing or not this session's; reload the page and try again")
        return person


def is_form(request: Request) -> bool:
    return form_content_type(request.headers.get("content-type", ""))


async def fields(request: Request) -> dict[str, str]:
    """A posted form's or JSON object's text fields (anything else ignored); a 400 for a body that is neither."""
    if is_form(request):
        return {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    try:
        body = await request.json() if (await request.body()).strip() else {}
    except ValueError:
        raise PageRefused(400, "the body is not JSON; send a JSON object or a form") from None
    if not isinstance(body, dict):
        raise PageRefused(400, "the body must be a JSON object")
    return {k: v for k, v in body.items() if isinstance(v, str)}


def page(template: str, status: int = 200, /, **values: Any) -> HTMLResponse:
    return HTMLResponse(TEMPLATES.get_template(template).render(**values), status_code=status)


def set_session(response: Response, request: Request, new: NewSession) -> Response:
    """The session's cookie: never readable by scripts, ``Secure`` over TLS, not sent by another site's posts."""
    response.set_cookie(
        SESSION_COOKIE,
        new.token,
        max_age=new.max_age,
        path="/",
        httponly=True,
        secure=request.url.scheme == "https",
        samesite="lax",
    )
    return response


def clear_session(response: Response, request: Request) -> Response:
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, secure=request.url.scheme == "https", samesite="lax"
    )
    return response


def refused_json(err: PageRefused) -> JSONResponse:
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers or None)


def redirect(to: str) -> RedirectResponse:
    return RedirectResponse(to, status_code=303)


def local_path(text: str, default: str) -> str:
    """``text`` when it is a path on this site (never another site's address), else ``default``."""
    ok = text.startswith("/") and not text.startswith("//") and "\\" not in text and "\n" not in text
    return text if ok else default


def web_draft(request: Request) -> AuditDraft:
    """The call's audit draft (the admin listener opened it already; the public listener did not)."""
    draft: AuditDraft | None = getattr(request.state, "audit", None)
    if draft is None:
        draft = AuditDraft(actor="unknown", source=SOURCE_WEB, action=f"{request.method} {request.url.path}")
        request.state.audit = draft
    draft.source = SOURCE_WEB
    return draft


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


__all__ = [
    "TEMPLATES",
    "PageRefused",
    "WebSessions",
    "clear_session",
    "client_address",
    "fields",
    "is_form",
    "local_path",
    "page",
    "redirect",
    "refused_json",
    "set_session",
    "web_draft",
]
