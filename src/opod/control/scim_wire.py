"""SCIM 2.0 on the wire (RFC 7644): refusals as SCIM ``Error``, searches and list pages, bodies, a User's fields.

The resources and their routes are :mod:`opod.control.scim`'s; this module holds what any of them
reads or answers with, and nothing of opod's state. The leader imports it at start (SCIM's routes,
its refusals), so ``scim2_models``, slow to import, is imported only by the functions that
build its models: most leaders never see a SCIM call.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from scim2_models import Context, EnterpriseUser, User

PREFIX = "/scim/v2"
MEDIA_TYPE = "application/scim+json"
BODY_MAX = 1024 * 1024
"""The largest body a provider may send: a group push of thousands of members fits."""
PAGE_MAX = 200
"""At most this many resources an answer; a provider pages with ``startIndex`` and ``count``."""


class ScimError(Exception):
    """A refusal as RFC 7644 writes it: ``status``, ``scimType`` and a ``detail`` saying what to do."""

    def __init__(self, status: int, detail: str, scim_type: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.scim_type = scim_type

    def response(self) -> Response:
        from scim2_models import Error as ScimErrorBody

        body = ScimErrorBody(status=self.status, detail=self.detail, scim_type=self.scim_type).model_dump()
        headers = {"WWW-Authenticate": 'Bearer realm="opod SCIM"'} if self.status == 401 else None
        return scim_response(body, self.status, headers)


def scim_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, default=str), status_code=status, media_type=MEDIA_TYPE, headers=headers)


def search_request(request: Request, model: Any, body: dict[str, Any] | None = None) -> Any:
    """What a listing asks for (``filter``, ``startIndex``, ``count``, ``attributes``, ``excludedAttributes``), from
    the query string or a ``/.search`` body, as a ``SearchRequest`` over ``model``."""
    from scim2_models import Context, SearchRequest

    if body is None:
        query = request.query_params
        body = {name: query[name] for name in _SEARCH_PARAMS if query.get(name)}
        for name in ("startIndex", "count"):
            if name in body:
                body[name] = _whole(name, body[name])
    try:
        return SearchRequest[model].model_validate(body, scim_ctx=Context.SEARCH_REQUEST)
    except ValidationError as err:
        where = {str(e["loc"][0]) if e["loc"] else "" for e in err.errors()}
        kind = "invalidFilter" if "filter" in where else "invalidValue"
        raise ScimError(400, _reasons(err), kind) from None


_SEARCH_PARAMS = ("filter", "startIndex", "count", "attributes", "excludedAttributes", "sortBy", "sortOrder")


def page(search: Any, resources: list[Any], kind: Any) -> dict[str, Any]:
    """The page ``search`` asks for (``startIndex`` from 1, at most :data:`PAGE_MAX`), as a ``ListResponse``, each
    resource showing the attributes asked for."""
    from scim2_models import Context, ListResponse

    start = max(1, search.start_index or 1)
    count = min(PAGE_MAX, max(0, PAGE_MAX if search.count is None else search.count))
    shown = resources[start - 1 : start - 1 + count]
    listing = ListResponse[kind](total_results=len(resources), start_index=start, items_per_page=len(shown))
    body = listing.model_dump(scim_ctx=Context.SEARCH_RESPONSE)
    body["Resources"] = [r.model_dump(scim_ctx=Context.SEARCH_RESPONSE, response_parameters=search) for r in shown]
    return body


def _whole(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ScimError(400, f"{name} {text!r} is not a whole number", "invalidValue") from None


def _reasons(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors())


def one_or_list(request: Request, found: dict[str, dict[str, Any]], what: str, kind: Any) -> Response:
    """One of ``found`` by the path's ``id``, or all of them as a list."""
    from scim2_models import Context, ListResponse

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


async def read_json(request: Request) -> dict[str, Any]:
    """The body: at most :data:`BODY_MAX` bytes of JSON, an object."""
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
    return data


async def read_body(request: Request, model: Any, context: Context) -> Any:
    """The body as ``model`` in ``context``: :func:`read_json`, and valid."""
    data = await read_json(request)
    try:
        return model.model_validate(data, scim_ctx=context)
    except ValidationError as err:
        raise ScimError(400, _reasons(err), "invalidValue") from None


def user_fields(user: User[EnterpriseUser]) -> dict[str, Any]:
    """What opod keeps of a SCIM User beside its resource: the userName as given (any text), the email from
    ``emails`` (the primary one first, else the first; the userName when it is an address and none is sent), the name
    (its displayName, else its formatted name, else given and family names), the state and the externalId."""
    if not user.user_name or not user.user_name.strip():
        raise ScimError(400, "userName: a User needs one (any text the provider names them by)", "invalidValue")
    sent = sorted((e for e in user.emails or [] if e.value), key=lambda e: not e.primary)
    email = str(sent[0].value).strip() if sent else user.user_name.strip()
    if not _EMAIL.fullmatch(email):
        where = f"emails: {email!r} is not an email address" if sent else "emails: none sent"
        raise ScimError(
            400,
            f"{where}, and userName {user.user_name!r} is not one either; send the person's address in emails "
            '(emails: [{"value": "ADDRESS", "primary": true}])',
            "invalidValue",
        )
    parts = " ".join(p for p in (user.name.given_name, user.name.family_name) if p) if user.name is not None else ""
    formatted = user.name.formatted if user.name is not None else None
    return {
        "user_name": user.user_name.strip(),
        "email": email,
        "name": user.display_name or formatted or parts or "",
        "state": "disabled" if user.active is False else "active",
        "external_id": user.external_id or "",
    }


_EMAIL = re.compile(r"[^@\s]+@[^@\s]+")


def audit_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A User's fields as the audit names them (SCIM's names)."""
    return {
        "userName": fields["user_name"],
        "email": fields["email"],
        "name": fields["name"],
        "active": fields["state"] != "disabled",
        "externalId": fields["external_id"],
    }


__all__ = [
    "BODY_MAX",
    "MEDIA_TYPE",
    "PAGE_MAX",
    "PREFIX",
    "ScimError",
    "audit_fields",
    "one_or_list",
    "page",
    "read_body",
    "read_json",
    "scim_response",
    "search_request",
    "user_fields",
]
