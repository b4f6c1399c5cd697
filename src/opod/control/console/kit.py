"""What every console page shares: its templates, the signed-in person, the checks on a change, and its audit row.

A page is a GET that renders a template for the signed-in person, or a fragment of it (the block
named by :data:`FRAGMENT_HEADER`, which the console's script asks for to swap a list's rows in place
when paging or filtering). An action is a POST of a JSON object (or a form) that passes, in order:
a signed-in person (401), their session's CSRF token in :data:`~opod.control.console.auth.CSRF_HEADER`
(403), and the role the action needs (403). It then calls the same service as ``/api/v1``, with the
call's audit draft naming the person as the actor, ``source: web``, and the management API's own
action (``POST /api/v1/nodes/{id}/state``), so the audit shows one change however it was made. A
refusal is recorded the same way, with its status, and nothing is changed.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import ChoiceLoader, Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from opod.control.console.auth import CSRF_HEADER, OPERATE, READ, SIGN_IN, Viewer
from opod.control.console.auth import PageAuth as PageAuth
from opod.control.context import ControlError
from opod.store import Store
from opod.store.audit import SOURCE_WEB, AuditDraft
from opod.store.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreError
from opod.store.offloop import run_sync

log = logging.getLogger("opod.control")

PREFIX = "/console"
FRAGMENT_HEADER = "X-Console-Fragment"
"""A GET with this header answers only the named block of its page's template (``rows``)."""
MAX_FIELDS_BODY = 64 * 1024
"""The largest body a page's change may post."""
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50

NAV = (
    ("summary", "Summary", ""),
    ("nodes", "Nodes", "/nodes"),
    ("models", "Models", "/models"),
    ("jobs", "Jobs", "/jobs"),
    ("batches", "Batches", "/batches"),
    ("canaries", "Canaries", "/canaries"),
    ("evals", "Evals", "/evals"),
    ("keys", "Keys", "/keys"),
    ("usage", "Usage", "/usage"),
    ("audit", "Audit", "/audit"),
    ("settings", "Settings", "/settings"),
)

_REFUSALS: dict[type[StoreError], int] = {InvalidInput: 400, Forbidden: 403, NotFound: 404, Conflict: 409}


def _percent(part: float, whole: float) -> int:
    return 0 if whole <= 0 else max(0, min(100, round(100 * part / whole)))


def _micros(value: int) -> str:
    return f"${value / 1_000_000:,.2f}"


def site_templates(
    *, site: str, prefix: str, nav: tuple[tuple[str, str, str], ...], package: str = "opod.control.console"
) -> Environment:
    """The templates of a site of pages (the console, the members' portal): ``package``'s own first, then the
    console's layout, macros and error page, which every site shares (one copy); ``site`` names it in titles."""
    own = PackageLoader(package, "templates")
    shared = PackageLoader("opod.control.console", "templates")
    templates = Environment(
        loader=own if package == "opod.control.console" else ChoiceLoader([own, shared]),
        autoescape=select_autoescape(default=True, default_for_string=True),
        auto_reload=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.filters["percent"] = _percent
    templates.filters["micros"] = _micros
    templates.filters["q"] = lambda value: quote(str(value), safe="")
    templates.globals.update(site=site, prefix=prefix, nav=nav, page_sizes=PAGE_SIZES)
    macros = templates.get_template("macros.html").module
    # The macros every page uses, as globals: a block rendered alone (a fragment) sees them too.
    templates.globals.update(
        pager=macros.pager,  # type: ignore[attr-defined]
        bar=macros.bar,  # type: ignore[attr-defined]
        size_select=macros.size_select,  # type: ignore[attr-defined]
        search_box=macros.search_box,  # type: ignore[attr-defined]
        state_select=macros.state_select,  # type: ignore[attr-defined]
    )
    return templates


TEMPLATES = site_templates(site="console", prefix=PREFIX, nav=NAV)


class Refused(Exception):
    """An action refused before or by its service: the status and what to do about it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Done:
    """What an action answers: a sentence for the page's status line, and what to show again."""

    message: str
    refresh: str = "rows"
    """The block of the page to fetch again (its rows changed); ``""`` for none."""
    data: Mapping[str, Any] | None = None


Page = Callable[[Request, Viewer], Awaitable[Response]]
Action = Callable[[Request, Viewer, dict[str, str], AuditDraft], Awaitable[Done]]


class Console:
    """The pages' shared collaborator: sign-in, CSRF and roles through ``auth``; refusals' audit rows in ``store``.
    ``reads`` is the right every page needs (``""``: any signed-in person, as the members' portal has it)."""

    def __init__(self, auth: PageAuth, store: Store, templates: Environment = TEMPLATES, *, reads: str = READ) -> None:
        self.auth = auth
        self.store = store
        self.templates = templates
        self.reads = reads

    # --- pages -------------------------------------------------------------------------------

    def page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        """A GET: the signed-in person's page, or a redirect to sign in first."""

        async def endpoint(request: Request) -> Response:
            viewer = await self.auth.viewer(request)
            if viewer is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{SIGN_IN}?{urlencode({'next': target})}", status_code=303)
            if self.reads and not self.auth.may(viewer, self.reads):
                message = f"{viewer.name} holds no role here: these pages are for a viewer, operator, billing or admin"
                return self.render(
                    request, viewer, "error.html", {"title": "Not yours", "message": message}, status=403
                )
            try:
                return await handler(request, viewer)
            except Refused as err:
                return self.render(
                    request, viewer, "error.html", {"title": "Not possible", "message": err.message}, status=err.status
                )
            except (StoreError, ControlError) as err:
                status, message = _status(err)
                return self.render(
                    request, viewer, "error.html", {"title": "Not possible", "message": message}, status=status
                )

        return endpoint

    def render(
        self, request: Request, viewer: Viewer, template: str, values: Mapping[str, Any], *, status: int = 200
    ) -> HTMLResponse:
        """The page for ``viewer``, or only the block :data:`FRAGMENT_HEADER` names."""
        page = self.templates.get_template(template)
        context = {
            **values,
            "viewer": viewer,
            "csrf": self.auth.csrf_token(request),
            "may": lambda action: self.auth.may(viewer, action),
            "here": request.url.path,
            "query": dict(request.query_params),
            "OPERATE": OPERATE,
        }
        block = request.headers.get(FRAGMENT_HEADER, "")
        if block and block in page.blocks:
            html = "".join(page.blocks[block](page.new_context(context)))
        else:
            html = page.render(context)
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store", "Vary": FRAGMENT_HEADER})

    # --- actions -----------------------------------------------------------------------------

    def action(
        self, needs: str, api: str, handler: Action, *, target: str = ""
    ) -> Callable[[Request], Awaitable[Response]]:
        """A POST that needs the right ``needs`` (``""``: any signed-in person, the handler checking what they hold),
        recorded as the management API's ``api`` (``POST /api/v1/...``) on ``target`` (``node:{id}``, filled from the
        path) as the service names it."""

        async def endpoint(request: Request) -> Response:
            viewer = await self.auth.viewer(request)
            draft = _draft(request, viewer, api, target)
            try:
                if viewer is None:
                    raise Refused(401, "you are not signed in (or your session ended); sign in again")
                token = self.auth.csrf_token(request)
                given = request.headers.get(CSRF_HEADER, "")
                fields = await _fields(request)
                given = given or fields.pop("csrf", "")
                if not token or not hmac.compare_digest(given.encode(), token.encode()):
                    raise Refused(403, f"{CSRF_HEADER}: missing or not this session's; reload the page and try again")
                if needs and not self.auth.may(viewer, needs):
                    raise Refused(403, f"{viewer.name} ({viewer.role}) may not do this: it needs the {needs} right")
                done = await handler(request, viewer, fields, draft)
            except (Refused, StoreError, ControlError) as err:
                status, message = _status(err)
                await self._record(draft, status)
                return JSONResponse({"error": message}, status_code=status)
            if not draft.committed:  # a change kept in memory only: its row is written here
                await self._record(draft, 200)
            answer = {"message": done.message, "refresh": done.refresh, **(done.data or {})}
            return JSONResponse(answer, headers={"Cache-Control": "no-store"})  # it may hold a secret shown once

        return endpoint

    async def _record(self, draft: AuditDraft, status: int) -> None:
        """The row of an action no change committed (a refusal), named as the API's call; the listener then adds none."""
        try:
            with draft.commit(status=status) as row:
                await run_sync(self.store.record_audit, row)
        except StoreError as err:
            log.error("could not record the audit row of %s: %s", draft.action, err)


def _draft(request: Request, viewer: Viewer | None, api: str, target: str) -> AuditDraft:
    """The call's draft (the listener opened one), made the person's, from the web, and named as the API's call."""
    draft: AuditDraft | None = getattr(request.state, "audit", None)
    if draft is None:
        draft = AuditDraft(actor="unknown", source=SOURCE_WEB, action=api)
        request.state.audit = draft
    draft.source = SOURCE_WEB
    draft.actor = viewer.actor if viewer is not None else "unknown"
    params = request.path_params
    draft.action = api
    draft.target = target.format(**params) if target else "/".join(str(v) for v in params.values())
    draft.body = None
    return draft


async def _fields(request: Request) -> dict[str, str]:
    """A posted JSON object's or form's text fields; 400 for a body that is neither, 413 past :data:`MAX_FIELDS_BODY`
    (the admin listener caps bodies before this; the public one, serving the portal, does not)."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_FIELDS_BODY:
            raise Refused(413, f"the body is over {MAX_FIELDS_BODY // 1024} KiB; a page's change is a few fields")
    if request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        return {k: v for k, v in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True)}
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refused(400, "the body is not JSON; send a JSON object") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in body.items()}


def _status(err: Exception) -> tuple[int, str]:
    if isinstance(err, Refused | ControlError):
        return err.status, err.message
    status = next((s for kind, s in _REFUSALS.items() if isinstance(err, kind)), 503)
    return status, str(err) if status != 503 else f"the store failed: {err}; retry shortly"


def whole(text: str | None, field: str, *, low: int, high: int, default: int | None = None) -> int | None:
    """A whole number a page was sent (a query or a field), or ``default`` when none; 400 naming ``field`` otherwise."""
    if text is None or not str(text).strip():
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        raise Refused(400, f"{field}: {text!r} is not a whole number; give one from {low} to {high}") from None
    if not low <= value <= high:
        raise Refused(400, f"{field}: {value} is outside {low}..{high}")
    return value


def page_size(request: Request) -> int:
    size = whole(request.query_params.get("size"), "size", low=1, high=max(PAGE_SIZES), default=DEFAULT_PAGE_SIZE)
    return size or DEFAULT_PAGE_SIZE


def link(request: Request, **changes: str | int | None) -> str:
    """This page's address with ``changes`` to its query (a ``None`` or empty value taken out)."""
    query = {**request.query_params, **{k: str(v) for k, v in changes.items() if v not in (None, "")}}
    for key, value in changes.items():
        if value in (None, ""):
            query.pop(key, None)
    return request.url.path + (f"?{urlencode(query)}" if query else "")
