"""The console's and the portal's :class:`~opod.control.console.auth.PageAuth` over the store's sessions.

A page's person is the session cookie's (:class:`~opod.control.web.pages.WebSessions`), looked up once per
request and kept on it, so the CSRF token the page renders is that session's. What they may do is their
role's (:data:`opod.access.permissions.ROLES`): the console's action words are the roles' own.
"""

from __future__ import annotations

from starlette.requests import Request

from opod.access.permissions import ROLES, Action
from opod.access.sessions import SignedIn
from opod.control.console.auth import Viewer
from opod.control.web.pages import WebSessions


class SessionPages:
    def __init__(self, sessions: WebSessions) -> None:
        self._sessions = sessions

    async def viewer(self, request: Request) -> Viewer | None:
        signed = await self._sessions.person(request)
        request.state.signed_in = signed
        if signed is None:
            return None
        person = signed.person
        return Viewer(actor=signed.actor, name=person.name or person.email, role=person.role, user_id=person.id)

    def may(self, viewer: Viewer, action: str) -> bool:
        try:
            wanted = Action(action)
        except ValueError:
            return False
        return wanted in ROLES.get(viewer.role, frozenset())

    def csrf_token(self, request: Request) -> str:
        signed: SignedIn | None = getattr(request.state, "signed_in", None)
        return signed.csrf if signed is not None else ""
