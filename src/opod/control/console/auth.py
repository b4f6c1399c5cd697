"""Who is looking at a console page, and what they may do: the seam the sessions of ``access`` plug into.

The pages know a person only through :class:`PageAuth`, handed to them once in the composition
root: the signed-in person of a request (``None`` sends them to :data:`SIGN_IN`), whether they may
take an action, and their session's CSRF token, which every change must carry back
(:data:`CSRF_HEADER`). The action words are the roles' own (``opod.access.permissions``): a viewer
holds ``read`` alone, an operator ``operate`` too, an admin everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request

SIGN_IN = "/signin"
"""Where a request without a signed-in person is sent (with ``?next=`` the page it asked for)."""
CSRF_HEADER = "X-CSRF-Token"
"""The header a page's change carries its session's CSRF token in (the console's script sets it)."""

READ = "read"
"""See every page."""
OPERATE = "operate"
"""Change the fleet: drain and cordon nodes, scale models, set their class, add presets."""
KEYS = "keys"
"""Revoke API keys."""
SETTINGS = "settings"
"""Save a settings version, or roll back to an earlier one."""


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in person a page is for."""

    actor: str
    """Who the audit names for their changes (letters, digits and ``._-@``: an e-mail address or a user name)."""
    name: str
    """How the page greets them."""
    role: str
    """viewer, operator, billing or admin (shown beside their name); ``""`` for a person who only uses the fleet."""
    user_id: str = ""
    """Their id in the people area (``usr_...``), whose memberships say which projects are theirs in the portal;
    ``""`` for a person it does not hold."""


class PageAuth(Protocol):
    """What the console asks of sign-in and sessions (built in the composition root, one for the leader)."""

    async def viewer(self, request: Request) -> Viewer | None:
        """The signed-in person of ``request``; ``None`` when nobody is (or their session ended)."""
        ...

    def may(self, viewer: Viewer, action: str) -> bool:
        """Whether ``viewer`` may take ``action`` (:data:`OPERATE`, :data:`KEYS`, :data:`SETTINGS`, ...)."""
        ...

    def csrf_token(self, request: Request) -> str:
        """The CSRF token of ``request``'s session, which its changes must send back; ``""`` without a session."""
        ...


class SignedOut:
    """A :class:`PageAuth` with nobody signed in: every page sends its visitor to :data:`SIGN_IN`. What a leader
    serves until a sign-in is wired in front of its console."""

    async def viewer(self, request: Request) -> Viewer | None:
        return None

    def may(self, viewer: Viewer, action: str) -> bool:
        return False

    def csrf_token(self, request: Request) -> str:
        return ""
