"""Helpers of the sign-in tests: accounts made with the admin key, browsers as clients of real HTTP, settings put."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from tests.support.inprocess import InProcessLeader as Leader

PASSWORD = "correct horse battery"


def account(leader: Leader, email: str, role: str = "", password: str = PASSWORD) -> str:
    """A local account made with the admin key; its person's id."""
    status, body = leader.admin("POST", "/api/v1/accounts", {"email": email, "role": role, "password": password})
    assert status == 201, body
    return str(body["id"])


def browser(leader: Leader, *, public: bool = False, address: str | None = None) -> httpx.Client:
    """A client of the admin listener (or the public one) over real HTTP, keeping cookies, from ``address``."""
    transport = httpx.HTTPTransport(local_address=address) if address else None
    return httpx.Client(base_url=leader.url if public else leader.admin_url, transport=transport, timeout=30)


def signed_in(
    leader: Leader, email: str, password: str = PASSWORD, *, public: bool = False
) -> tuple[httpx.Client, str]:
    """A browser signed in as ``email``, and its session's CSRF token."""
    client = browser(leader, public=public)
    answer = client.post("/signin", json={"username": email, "password": password})
    assert answer.status_code == 200, answer.text
    return client, str(answer.json()["csrf_token"])


def put_settings(leader: Leader, text: str) -> None:
    status, newest = leader.admin("GET", "/api/v1/settings")
    assert status == 200, newest
    status, body = leader.admin("PUT", "/api/v1/settings", {"base": newest.get("version", 0), "body": text})
    assert status == 200, body


def audit_rows(leader: Leader, actor: str, *, until: Callable[[list[dict]], bool] | None = None) -> list[dict]:
    """The audit's rows by ``actor``, oldest first.

    A call's row is recorded once its answer has gone out, so a test reading right after a call passes ``until``:
    the rows are read again (for up to 10 s) until it holds of them, and returned as last read either way."""
    deadline = time.monotonic() + 10
    while True:
        status, rows = leader.admin("GET", f"/api/v1/audit?actor={actor}&limit=1000")
        assert status == 200, rows
        oldest_first = list(reversed(rows))
        if until is None or until(oldest_first) or time.monotonic() > deadline:
            return oldest_first
        time.sleep(0.05)
