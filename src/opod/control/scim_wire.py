"""SCIM 2.0 on the wire (RFC 7644): refusals as SCIM ``Error``, list pages, the one filter, bodies, a User's fields.

The resources and their routes are :mod:`opod.control.scim`'s; this module holds what any of them
reads or answers with, and nothing of opod's state.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError
from scim2_models import Context, EnterpriseUser, ListResponse, User
from scim2_models import Error as ScimErrorBody
from starlette.requests import Request
from starlette.responses import Response

from opod.store.people import UserRecord

PREFIX = "/scim/v2"
MEDIA_TYPE = "application/scim+json"
BODY_MAX = 1024 * 1024
"""The largest body a provider may send: a group push of thousands of members fits."""
PAGE_MAX = 200
"""At most this many resources an answer; a provider pages with ``startIndex`` and ``count``."""

_FILTER = re.compile(r'^\s*(\w+)\s+eq\s+"((?:[^"\\]|\\.)*)"\s*$', re.IGNORECASE)


class ScimError(Exception):
    """A refusal as RFC 7644 writes it: ``status``, ``scimType`` and a ``detail`` saying what to do."""

    def __init__(self, status: int, detail: str, scim_type: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.scim_type = scim_type

    def response(self) -> Response:
        body = ScimErrorBody(status=self.status, detail=self.detail, scim_type=self.scim_type).model_dump()
        headers = {"WWW-Authenticate": 'Bearer realm="opod SCIM"'} if self.status == 401 else None
        return scim_response(body, self.status, headers)


def scim_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str), status_code=status, media_type=MEDIA_TYPE, headers=headers)


USER_FILTERS = {"username": "userName", "externalid": "externalId", "id": "id"}
GROUP_FILTERS = {"displayname": "displayName", "id": "id"}


def read_filter(request: Request, allowed: dict[str, str]) -> tuple[str, str] | None:
    """The one filter opod answers: ``ATTRIBUTE eq "VALUE"``; None without a filter."""
    text = request.query_params.get("filter")
    if not text:
        return None
    match = _FILTER.match(text)
    if match is None or match.group(1).lower() not in allowed:
        forms = " or ".join(f'{a} eq "VALUE"' for a in allowed.values())
        raise ScimError(400, f"filter {text!r}: opod answers {forms}", "invalidFilter")
    return allowed[match.group(1).lower()], match.group(2).replace('\\"', '"')


def matches(wanted: tuple[str, str] | None, user: UserRecord) -> bool:
    if wanted is None:
        return True
    attribute, value = wanted
    if attribute == "userName":
        return user.email.lower() == value.lower()  # userName is case-insensitive (RFC 7643 4.1.1)
    if attribute == "externalId":
        return bool(user.external_id) and user.external_id == value
    return user.id == value


def page(request: Request, resources: list[dict[str, Any]], kind: Any) -> dict[str, Any]:
    """The page ``startIndex`` and ``count`` ask for, as a ``ListResponse``."""
    start = max(1, _int(request, "startIndex", 1))
    count = min(PAGE_MAX, max(0, _int(request, "count", PAGE_MAX)))
    shown = resources[start - 1 : start - 1 + count]
    body = ListResponse[kind](total_results=len(resources), start_index=start, items_per_page=len(shown)).model_dump(
        scim_ctx=Context.SEARCH_RESPONSE
    )
    body["Resources"] = shown
    return body


def _int(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ScimError(400, f"{name} {text!r} is not a whole number", "invalidValue") from None


def one_or_list(request: Request, found: dict[str, dict[str, Any]], what: str, kind: Any) -> Response:
    """One of ``found`` by the path's ``id``, or all of them as a list."""
    wanted = request.path_params.get("id")
    if wanted is None:
        body = ListResponse[kind](total_results=len(found), start_index=1, items_per_page=len(found)).model_dump(
            scim_ctx=Context.SEARCH_RESPONSE
        )
        body["Resources"] = list(found.values())
        return scim_response(body)
    if wanted not in found:
        raise ScimError(404, f"no {what} {wanted!r}; GET {PREFIX}/{what}s lists them")
    return scim_response(found[wanted])


async def read_body(request: Request, model: Any, context: Context) -> Any:
    """The body as ``model`` in ``context``: at most :data:`BODY_MAX` bytes of JSON, an object, valid."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > BODY_MAX:
        raise ScimError(413, f"the body is {declared} bytes; SCIM takes at most {BODY_MAX}")
    raw = await request.body()
    if len(raw) > BODY_MAX:
        raise ScimError(413, f"the body is over {BODY_MAX} bytes")
    try:
        data = json.loads(raw or b"null")
    except ValueError:
        raise ScimError(
            400, "the body is not JSON; send a SCIM resource as application/scim+json", "invalidSyntax"
        ) from None
    if not isinstance(data, dict):
        raise ScimError(400, "send a SCIM resource: a JSON object with its schemas", "invalidSyntax")
    try:
        return model.model_validate(data, scim_ctx=context)
    except ValidationError as err:
        parts = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors())
        raise ScimError(400, parts, "invalidValue") from None


def user_fields(user: User[EnterpriseUser], before: User[EnterpriseUser] | None = None) -> dict[str, Any]:
    """What opod keeps of a SCIM User: the email is its userName; the name is its displayName, else its name.

    After a patch (``before`` given), the name is the part the patch changed, so a new given name is not
    hidden behind the formatted name the resource showed before."""
    if not user.user_name or not user.user_name.strip():
        raise ScimError(400, "userName: a User needs one (opod keeps it as the person's email)", "invalidValue")
    parts = " ".join(p for p in (user.name.given_name, user.name.family_name) if p) if user.name is not None else ""
    formatted = user.name.formatted if user.name is not None else None
    if before is None:
        name = user.display_name or formatted or parts
    elif user.display_name != before.display_name:
        name = user.display_name or ""
    elif user.name != before.name:
        was = before.name.formatted if before.name is not None else None
        name = formatted if formatted and formatted != was else parts or formatted or ""
    else:
        name = user.display_name or ""
    return {
        "email": user.user_name.strip(),
        "name": name,
        "state": "disabled" if user.active is False else "active",
        "external_id": user.external_id or "",
    }


def audit_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A User's fields as the audit names them (SCIM's names)."""
    return {
        "userName": fields["email"],
        "name": fields["name"],
        "active": fields["state"] != "disabled",
        "externalId": fields["external_id"],
    }


__all__ = [
    "BODY_MAX",
    "GROUP_FILTERS",
    "MEDIA_TYPE",
    "PAGE_MAX",
    "PREFIX",
    "USER_FILTERS",
    "ScimError",
    "audit_fields",
    "matches",
    "one_or_list",
    "page",
    "read_body",
    "read_filter",
    "scim_response",
    "user_fields",
]
