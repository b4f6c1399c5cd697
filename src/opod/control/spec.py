"""The management API's conventions that every route shares: answers without ``null``, and its document.

Every area builds its routes on :class:`SpecRouter`, so an answer leaves out a
field that is ``None`` instead of writing ``null``. :func:`document` is
``GET /api/v1/openapi.json``: FastAPI's description of the routes this
application has, put into the spec's form: components named as the spec names
them (``catalog.Model``), no ``null`` alternatives, no titles, the bearer
scheme on every operation, ``X-Llmgw-Actor`` on every change, and every
operation's refusals as ``ErrorView``. Routes opod has beyond the spec are
tagged ``opod`` and marked ``x-opod-extension``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi

from opod import __version__
from opod.contract.admin.common import ErrorView

EXTENSION_TAG = "opod"
"""The tag of routes opod has beyond the spec (node tokens, load and unload)."""

ACTOR_PARAMETER = {
    "name": "X-Llmgw-Actor",
    "in": "header",
    "required": False,
    "description": "Who the change is recorded as made by: letters, digits and ._-@, at most 64; unknown when absent.",
    "schema": {"type": "string"},
}

_ERROR_REF = {"$ref": "#/components/schemas/ErrorView"}
_RESPONSES = {
    "Error": {"description": "Refused; the error says why.", "content": {"application/json": {"schema": _ERROR_REF}}},
    "Unauthorized": {
        "description": "The admin token is missing or wrong.",
        "content": {"application/json": {"schema": _ERROR_REF}},
    },
}
_SECURITY = {
    "adminToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "The admin key `opod up` printed (also in the leader's home), sent as Authorization: Bearer KEY.",
    }
}
_FASTAPI_ONLY = ("HTTPValidationError", "ValidationError")


class SpecRouter(APIRouter):
    """An ``APIRouter`` whose answers leave out ``None`` fields (the spec writes no ``null``)."""

    def add_api_route(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        kwargs["response_model_exclude_none"] = True
        super().add_api_route(path, endpoint, **kwargs)


def document(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app``'s ``/api`` routes, in the spec's form."""
    raw = get_openapi(
        title="opod management API",
        version=__version__,
        description=(
            "The management API of an opod leader, on its admin listener. Every path under /api needs the admin key "
            "as a bearer token. Durations in bodies are integer nanoseconds. Operations tagged opod are opod's own, "
            "beyond the management API's specification."
        ),
        routes=app.routes,
    )
    raw["paths"] = {path: item for path, item in raw.get("paths", {}).items() if path.startswith("/api/")}
    names = _spec_names(raw.get("components", {}).get("schemas", {}))
    doc = _rewrite(raw, names)
    schemas = {
        names.get(k, k): v for k, v in doc.get("components", {}).get("schemas", {}).items() if k not in _FASTAPI_ONLY
    }
    schemas["ErrorView"] = _rewrite(ErrorView.model_json_schema(), names)
    for path_item in doc.get("paths", {}).values():
        for method, op in path_item.items():
            _conform_operation(method, op)
    doc["servers"] = [{"url": "http://127.0.0.1:9090", "description": "The admin listener at its default address."}]
    doc["security"] = [{"adminToken": []}]
    doc["tags"] = [
        {"name": t} for t in sorted({op["tags"][0] for item in doc["paths"].values() for op in item.values()})
    ]
    doc["components"] = {
        "securitySchemes": _SECURITY,
        "parameters": {"Actor": ACTOR_PARAMETER},
        "responses": _RESPONSES,
        "schemas": dict(sorted(schemas.items())),
    }
    return doc


def _spec_names(schemas: dict[str, Any]) -> dict[str, str]:
    """FastAPI's component names → the spec's: a wire type whose spec name is not a Python name carries it as its title."""
    return {key: schema.get("title", key) for key, schema in schemas.items() if schema.get("title", key) != key}


def _conform_operation(method: str, op: dict[str, Any]) -> None:
    op.setdefault("tags", [EXTENSION_TAG])
    responses = op.setdefault("responses", {})
    responses.pop("422", None)
    for code, answer in responses.items():
        answer["description"] = {"200": "OK", "201": "Created", "202": "Accepted"}.get(
            code, answer.get("description", "")
        )
    responses["401"] = {"$ref": "#/components/responses/Unauthorized"}
    responses["default"] = {"$ref": "#/components/responses/Error"}
    params = [p for p in op.get("parameters", []) if p.get("name") != "X-Llmgw-Actor"]
    for param in params:
        if not param.get("required"):
            param.pop("required", None)
    if method not in ("get", "head"):
        params.append({"$ref": "#/components/parameters/Actor"})
    if params:
        op["parameters"] = params
    body = op.get("requestBody")
    if body is not None:
        body["required"] = bool(body.get("required"))
    if EXTENSION_TAG in op.get("tags", []):
        op["x-opod-extension"] = True


def _rewrite(node: Any, names: dict[str, str]) -> Any:
    """The document with spec names in every ``$ref``, no ``null`` alternatives, no titles and no ``null`` defaults."""
    if isinstance(node, list):
        return [_rewrite(v, names) for v in node]
    if not isinstance(node, dict):
        return node
    any_of = node.get("anyOf")
    if any_of is not None:
        kept = [v for v in any_of if v != {"type": "null"}]
        if len(kept) == 1:
            merged = {k: v for k, v in node.items() if k != "anyOf"} | kept[0]
            return _rewrite(merged, names)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "default" and value is None:
            continue
        if key == "$ref" and isinstance(value, str):
            head, _, name = value.rpartition("/")
            out[key] = f"{head}/{names.get(name, name)}"
        elif key == "additionalProperties" and value is True:
            out[key] = {}
        elif key in ("properties", "schemas", "paths", "content", "responses"):
            # maps keyed by names: a key called "title" is a field, not a title
            out[key] = {k: _rewrite(v, names) for k, v in value.items()}
        else:
            out[key] = _rewrite(value, names)
    return out
