"""Sign-in, sign-out, sign-up and whoami, on both listeners: a form (the pages) or JSON (scripts, a page's script).

``POST /signin`` ``{username, password}`` starts a session (its cookie, and the CSRF token in a JSON
answer); ``POST /signout`` ends it (with its CSRF token); ``POST /signup`` makes a local account
while ``auth.signup_open``; ``GET /whoami`` says who the session is. Each post is audited with
``source: web``. The rules are :class:`opod.access.signin.SignIn`'s; here requests are read and
answers shaped. A form's sign-in, sign-up or single sign-on that names no page to go to lands on the
listener's home for the person (:func:`console_home`, :func:`portal_home`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from opod.access.people import People
from opod.access.permissions import ROLES
from opod.access.sessions import NewSession, SignedIn
from opod.access.signin import SignIn, SignInUnavailable, TooManyFailures, WrongCredentials
from opod.control.audit import record_now
from opod.control.listener import cross_site
from opod.control.web.pages import (
    PageRefused,
    WebSessions,
    clear_session,
    client_address,
    fields,
    is_form,
    local_path,
    page,
    redirect,
    refused_json,
    set_session,
    web_draft,
)
from opod.security.passwords import PASSWORD_MIN
from opod.store import Store
from opod.store.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreError
from opod.store.people import UserRecord

_STATUS: dict[type[Exception], int] = {
    InvalidInput: 400,
    WrongCredentials: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    TooManyFailures: 429,
    SignInUnavailable: 503,
}


def _refusal(err: Exception) -> PageRefused:
    status = next((s for kind, s in _STATUS.items() if isinstance(err, kind)), 503)
    headers = {"Retry-After": str(err.retry_after)} if isinstance(err, TooManyFailures) else None
    message = str(err) if status != 503 or isinstance(err, SignInUnavailable) else f"the store failed: {err}"
    return PageRefused(status, message, headers)


def _person_json(signed_in: SignedIn, people: People) -> dict[str, object]:
    person = signed_in.person
    return {
        "id": person.id,
        "email": person.email,
        "name": person.name,
        "role": person.role,
        "memberships": [{"target": m.target, "role": m.role} for m in people.memberships(person.id)],
        "csrf_token": signed_in.csrf,
        "expires_at": signed_in.expires_at.isoformat(),
    }


SIGNED_IN_PAGE = "/signin"
"""Says who is signed in, with a sign-out button: where a person lands who has no other page on the listener."""

Home = Callable[[UserRecord], str]
"""Where a person lands on a listener after signing in, when the sign-in named no page."""


def console_home(person: UserRecord) -> str:
    """The admin listener's: the console for a person with a role, else the page saying who is signed in."""
    return "/console" if person.role in ROLES else SIGNED_IN_PAGE


def portal_home(person: UserRecord) -> str:
    """The public listener's: the members' portal, whoever they are."""
    return "/portal"


OIDC_COOKIE = "opod_oidc"
"""The OpenID flow's sealed state (state, nonce, PKCE verifier, where to go after), between start and callback."""
OIDC_PATH = "/auth/oidc"


def routes(signin: SignIn, people: People, store: Store, *, home: Home) -> list[Route]:
    """The routes above on one listener, whose ``home`` says where a person lands."""
    web = WebSessions(signin.sessions)

    def landing(asked: str, new: NewSession) -> str:
        """``asked`` when it is a page of this site worth going to, else the person's home."""
        to = local_path(asked, "")
        return to if to not in ("", "/", SIGNED_IN_PAGE) else home(new.signed_in.person)

    async def audited(
        request: Request, work: Callable[[], Awaitable[Response]], on_error: Callable[[PageRefused], Response]
    ) -> Response:
        """Run a post, answer its refusal, and record its audit row unless the change wrote it."""
        draft = web_draft(request)
        try:
            if is_form(request) and (why := cross_site(request.headers)):
                raise PageRefused(403, f"refused a form another site's page sent ({why})")
            response = await work()
        except PageRefused as err:
            response = on_error(err)
        except (StoreError, WrongCredentials, TooManyFailures, SignInUnavailable) as err:
            response = on_error(_refusal(err))
        if not draft.committed:
            await record_now(store, draft, response.status_code)
        return response

    def signin_page(request: Request, status: int = 200, error: str = "", username: str = "") -> Response:
        nxt = local_path(request.query_params.get("next", ""), "")
        return page("signin.html", status, error=error, username=username, next=nxt, signup_open=signin.signup_open)

    async def get_signin(request: Request) -> Response:
        person = await web.person(request)
        if person is not None:
            there = home(person.person)
            return page(
                "signed_in.html",
                person=person.person,
                csrf_token=person.csrf,
                home="" if there == SIGNED_IN_PAGE else there,
            )
        return signin_page(request)

    async def post_signin(request: Request) -> Response:
        form = is_form(request)
        got: dict[str, str] = {}

        async def work() -> Response:
            got.update(await fields(request))
            username = got.get("username") or got.get("email") or ""
            new = await signin.sign_in(
                username, got.get("password", ""), address=client_address(request), audit=web_draft(request)
            )
            return _started(request, new, landing(got.get("next", ""), new) if form else "")

        def on_error(err: PageRefused) -> Response:
            if not form:
                return refused_json(err)
            shown = signin_page(request, err.status, err.message, got.get("username", ""))
            shown.headers.update(err.headers)
            return shown

        return await audited(request, work, on_error)

    async def post_signout(request: Request) -> Response:
        async def work() -> Response:
            person = await web.change(request, await fields(request))
            await signin.sessions.end(person, audit=web_draft(request))
            done = redirect("/signin") if is_form(request) else JSONResponse({"signed_out": True})
            return clear_session(done, request)

        return await audited(request, work, refused_json)

    async def get_signup(request: Request) -> Response:
        return page("signup.html", signup_open=signin.signup_open, email="", name="", password_min=PASSWORD_MIN)

    async def post_signup(request: Request) -> Response:
        form = is_form(request)
        got: dict[str, str] = {}

        async def work() -> Response:
            got.update(await fields(request))
            web_draft(request).status = 201  # what a made account answers, in the audit row written with it
            new = await signin.sign_up(
                got.get("email", ""),
                got.get("name", ""),
                got.get("password", ""),
                address=client_address(request),
                audit=web_draft(request),
            )
            return _started(request, new, landing("", new) if form else "", status=201)

        def on_error(err: PageRefused) -> Response:
            if not form:
                return refused_json(err)
            return page(
                "signup.html",
                err.status,
                error=err.message,
                signup_open=signin.signup_open,
                email=got.get("email", ""),
                name=got.get("name", ""),
                password_min=PASSWORD_MIN,
            )

        return await audited(request, work, on_error)

    async def get_whoami(request: Request) -> Response:
        person = await web.person(request)
        if person is None:
            return JSONResponse({"error": "you are not signed in (or your session ended); sign in at /signin"}, 401)
        return JSONResponse(_person_json(person, people))

    async def get_oidc_start(request: Request) -> Response:
        """Off to the OpenID provider, with the flow's state sealed in a cookie only the callback reads."""
        if signin.oidc is None or not signin.oidc.flow.configured():
            return page(
                "signin.html",
                404,
                error="single sign-on is not configured here",
                username="",
                next="/",
                signup_open=signin.signup_open,
            )
        start = await signin.oidc.flow.begin(local_path(request.query_params.get("next", ""), "/"))
        answer = RedirectResponse(start.redirect_url, status_code=302)
        answer.set_cookie(
            OIDC_COOKIE,
            start.cookie_value,
            max_age=start.max_age,
            path=OIDC_PATH,
            httponly=True,
            secure=request.url.scheme == "https",
            samesite="lax",  # the provider sends the browser back with a top-level GET, which Lax lets through
        )
        return answer

    async def get_oidc_callback(request: Request) -> Response:
        cookie = request.cookies.get(OIDC_COOKIE, "")

        async def work() -> Response:
            new = await signin.complete_oidc(
                dict(request.query_params), cookie, address=client_address(request), audit=web_draft(request)
            )
            assert signin.oidc is not None  # complete_oidc refuses without it
            answer = _started(request, new, landing(signin.oidc.flow.return_to(cookie), new))
            answer.delete_cookie(OIDC_COOKIE, path=OIDC_PATH)
            return answer

        def on_error(err: PageRefused) -> Response:
            shown = signin_page(request, err.status, err.message)
            shown.delete_cookie(OIDC_COOKIE, path=OIDC_PATH)
            return shown

        return await audited(request, work, on_error)

    def _started(request: Request, new: NewSession, to: str, status: int = 200) -> Response:
        answer = redirect(to) if to else JSONResponse(_person_json(new.signed_in, people), status_code=status)
        answer.headers["Cache-Control"] = "no-store"
        return set_session(answer, request, new)

    return [
        Route("/signin", get_signin, methods=["GET"]),
        Route("/signin", post_signin, methods=["POST"]),
        Route("/signout", post_signout, methods=["POST"]),
        Route("/signup", get_signup, methods=["GET"]),
        Route("/signup", post_signup, methods=["POST"]),
        Route("/whoami", get_whoami, methods=["GET"]),
        Route("/auth/oidc/start", get_oidc_start, methods=["GET"]),
        Route(OIDC_PATH + "/callback", get_oidc_callback, methods=["GET"]),
    ]


__all__ = ["Home", "console_home", "portal_home", "routes"]
