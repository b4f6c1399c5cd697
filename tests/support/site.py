"""A site of pages (the console, the members' portal) on a leader in the test's process, and Chromium to look at it.

:class:`Site` is one of the leader's apps (the admin app, the public app) with a
:class:`~opod.control.console.auth.PageAuth` in front of its pages, called over ASGI on the leader's loop or served
on a loopback port for a browser. :class:`FixedViewer` is such a ``PageAuth`` with one person signed in (or nobody),
a role's rights and a fixed CSRF token: the pages' rendering and checks are tested without sessions, which the
sign-in area tests on its own. :func:`browser_fixture` is Debian's Chromium for a test module (:func:`needs_chromium`
skips the module without it), :func:`sign_in` a page signed in through the real sign-in form, and :func:`shots` the
folder screenshots go to.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp

from bench.ports import free_port
from opod.control.console.auth import CSRF_HEADER, Viewer
from tests.support.chromium import ARGS, CHROMIUM
from tests.support.inprocess import InProcessLeader

CSRF = "csrf-of-this-session"
RIGHTS = {
    "viewer": frozenset({"read"}),
    "operator": frozenset({"read", "operate"}),
    "billing": frozenset({"read"}),
    "admin": frozenset({"read", "operate", "keys", "settings", "administer"}),
}
SCREENSHOTS = "OPOD_CONSOLE_SCREENSHOTS"
"""Names the folder the browser tests write their screenshots to (the README's come from ``docs/screenshots/``)."""


@dataclass
class FixedViewer:
    """One person signed in for every request (``person`` None: nobody), with their role's rights."""

    person: Viewer | None
    token: str = CSRF
    asked: list[str] = field(default_factory=list)

    async def viewer(self, request: Request) -> Viewer | None:
        return self.person

    def may(self, viewer: Viewer, action: str) -> bool:
        self.asked.append(action)
        return action in RIGHTS.get(viewer.role, frozenset())

    def csrf_token(self, request: Request) -> str:
        return self.token if self.person is not None else ""


def person(role: str, actor: str | None = None) -> Viewer:
    return Viewer(actor=actor or f"{role}@example.com", name=f"{role.capitalize()} Person", role=role)


class Site:
    """``app`` of ``leader`` (answering as if on ``port``); calls go over ASGI on the leader's loop."""

    def __init__(self, leader: InProcessLeader, app: ASGIApp, port: int) -> None:
        self.leader = leader
        self.app = app
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://127.0.0.1:{port}")
        self._server: uvicorn.Server | None = None
        self.port = 0

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> httpx.Response:
        return self.leader.call(self.client.get(path, headers=dict(headers or {})))

    def post(self, path: str, body: Mapping[str, Any], *, csrf: str | None = CSRF) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if csrf is not None:
            headers[CSRF_HEADER] = csrf
        return self.leader.call(self.client.post(path, content=json.dumps(body).encode(), headers=headers))

    def serve(self) -> str:
        """Serve the app on a loopback port (on the leader's loop); its base address."""
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self.leader.call(self._start())
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        assert self._server is not None
        asyncio.get_running_loop().create_task(self._server.serve())
        for _ in range(200):
            if self._server.started:
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("the site's test listener did not start")

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        self.leader.call(self.client.aclose())


# --- Chromium -------------------------------------------------------------------------------------


def needs_chromium() -> Any:
    """Playwright's sync API, or the calling module skipped with a message where it or Debian's Chromium is missing
    (``.ci/run`` installs both); called at a browser test module's top, before any leader starts."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is not installed")
    if not CHROMIUM.is_file():
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
    return sync_api


def browser_fixture() -> Callable[[], Iterator[Any]]:
    """A module's ``browser`` fixture (``browser = browser_fixture()``): Debian's Chromium, launched once for the
    module, headless."""

    @pytest.fixture(scope="module")
    def browser() -> Iterator[Any]:
        with needs_chromium().sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            yield launched
            launched.close()

    return browser


def shots(tmp_path: Path) -> Path:
    """Where a test's screenshots go: :data:`SCREENSHOTS`'s folder, else the test's own output folder."""
    folder = Path(os.environ.get(SCREENSHOTS) or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sign_in(page: Any, url: str, email: str, password: str) -> None:
    """Sign ``page`` in at ``url``'s sign-in form, as a person would, and wait for where it lands."""
    page.goto(f"{url}/signin")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
