"""Helpers of the sign-in tests: accounts made with the admin key, browsers as clients of real HTTP, settings put."""

from __future__ import annotations

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


def audit_rows(leader: Leader, actor: str) -> list[dict]:
    """The audit's rows by ``actor``, oldest first."""
    status, rows = leader.admin("GET", f"/api/v1/audit?actor={actor}&limit=1000")
    assert status == 200, rows
    return list(reversed(rows))
