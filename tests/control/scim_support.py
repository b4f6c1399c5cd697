"""Calls as an identity provider and an operator make them, for the people and SCIM tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.support.inprocess import InProcessLeader as Leader

USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:Error"
LIST_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:ListResponse"


def call(
    method: str,
    url: str,
    body: object | None = None,
    *,
    token: str | None = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None or method not in ("GET", "HEAD"):
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw, status, got = response.read(), response.status, dict(response.headers.items())
    except urllib.error.HTTPError as error:
        raw, status, got = error.read(), error.code, dict(error.headers.items())
    return status, {k.lower(): v for k, v in got.items()}, json.loads(raw) if raw else None


def scim(
    leader: Leader, method: str, path: str, body: object | None = None, token: str | None = None
) -> tuple[int, dict[str, str], object]:
    """A SCIM call on the public listener, sent as a provider sends it (application/scim+json)."""
    return call(method, f"{leader.url}/scim/v2{path}", body, token=token, content_type="application/scim+json")


def admin(
    leader: Leader, method: str, path: str, body: object | None = None, actor: str = "alice"
) -> tuple[int, object]:
    """A management API call by ``actor``."""
    return leader.admin(method, path, body, headers={"X-Llmgw-Actor": actor} if method not in ("GET", "HEAD") else None)


def new_user(email: str, name: str = "", external_id: str = "", active: bool = True) -> dict:
    body: dict = {
        "schemas": [USER_SCHEMA],
        "userName": email,
        "active": active,
        "emails": [{"value": email, "primary": True}],
    }
    if name:
        given, _, family = name.partition(" ")
        body["name"] = {"givenName": given, "familyName": family}
    if external_id:
        body["externalId"] = external_id
    return body


def patch(*operations: dict) -> dict:
    return {"schemas": [PATCH_SCHEMA], "Operations": list(operations)}


def map_groups(leader: Leader, mapping: dict) -> None:
    """Put ``auth.scim_groups`` in the cluster settings (the rest of them kept)."""
    status, current = admin(leader, "GET", "/api/v1/settings")
    assert status == 200, current
    lines = ["auth:", "  scim_groups:"] + [
        f"    {json.dumps(name)}: {json.dumps(grant)}" for name, grant in mapping.items()
    ]
    body = "\n".join(lines) + "\n"
    status, answer = admin(leader, "PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, answer
