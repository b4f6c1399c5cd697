"""``GET /api/v1/openapi.json``, generated from the leader's routes, against the management API's specification.

Every operation of the spec is in the document with its path, method, operation id, tag, parameters, request body
and answers, and every body schema has the spec's fields with the spec's types; descriptions are opod's own and not
compared. Operations opod has beyond the spec are marked as extensions. The spec is read from ``../shared/spec``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    if not SPEC_PATH.is_file():
        pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})")
    return json.loads(SPEC_PATH.read_text())


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("document") / "home")
    yield up
    up.stop()


@pytest.fixture(scope="module")
def ours(leader: Leader) -> dict[str, Any]:
    status, _, body = http("GET", f"{leader.admin_url}/api/v1/openapi.json", key=leader.key)
    assert status == 200, body
    return body


def shape(schema: dict[str, Any]) -> Any:
    """What a schema says of a value's form: types, formats, items, maps, references and field names."""
    if "$ref" in schema:
        return {"$ref": schema["$ref"]}
    out: dict[str, Any] = {k: schema[k] for k in ("type", "format") if k in schema}
    if "items" in schema:
        out["items"] = shape(schema["items"])
    if "additionalProperties" in schema and schema["additionalProperties"] is not False:
        extra = schema["additionalProperties"]
        out["additionalProperties"] = shape(extra) if isinstance(extra, dict) else extra
    if "properties" in schema:
        out["properties"] = {name: shape(field) for name, field in schema["properties"].items()}
    for key in ("required", "nullable", "anyOf", "oneOf", "allOf"):
        if key in schema:
            out[key] = schema[key]
    return out


def operation(op: dict[str, Any]) -> dict[str, Any]:
    params = []
    for param in op.get("parameters", []):
        params.append(
            param
            if "$ref" in param
            else {
                "name": param["name"],
                "in": param["in"],
                "required": param.get("required", False),
                "schema": shape(param["schema"]),
            }
        )
    body = op.get("requestBody")
    return {
        "operationId": op.get("operationId"),
        "tags": op.get("tags"),
        "parameters": sorted(params, key=json.dumps),
        "requestBody": None
        if body is None
        else {
            "required": body.get("required", False),
            "content": {ct: shape(c["schema"]) for ct, c in body["content"].items()},
        },
        "responses": {
            code: answer
            if "$ref" in answer
            else {ct: shape(c["schema"]) for ct, c in answer.get("content", {}).items()}
            for code, answer in op["responses"].items()
        },
    }


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(method.upper(), path): op for path, item in doc["paths"].items() for method, op in item.items()}


def test_every_operation_of_the_spec_is_in_the_document_as_the_spec_has_it(spec: dict, ours: dict) -> None:
    theirs, mine = operations(spec), operations(ours)
    assert len(theirs) == 126
    missing = sorted(f"{m} {p}" for m, p in theirs.keys() - mine.keys())
    assert not missing, f"{len(missing)} operations are not routed: {missing}"
    differ = {
        f"{m} {p}": (operation(theirs[m, p]), operation(mine[m, p]))
        for m, p in theirs
        if operation(theirs[m, p]) != operation(mine[m, p])
    }
    assert not differ, f"{len(differ)} operations differ from the spec, e.g. {next(iter(differ.items()))}"


def test_every_schema_has_the_spec_fields_and_types(spec: dict, ours: dict) -> None:
    theirs, mine = spec["components"]["schemas"], ours["components"]["schemas"]
    missing = sorted(theirs.keys() - mine.keys())
    assert not missing, f"schemas the document lacks: {missing}"
    differ = {
        name: (shape(theirs[name]), shape(mine[name])) for name in theirs if shape(theirs[name]) != shape(mine[name])
    }
    assert not differ, f"{len(differ)} schemas differ from the spec, e.g. {next(iter(differ.items()))}"
    extension_bodies = {
        ref.rsplit("/", 1)[1] for op in operations(ours).values() if op.get("x-opod-extension") for ref in refs(op)
    }
    assert sorted(mine.keys() - theirs.keys() - extension_bodies) == [], (
        "a schema the spec does not have, used by a spec operation"
    )


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref" and isinstance(v, str)] + [
            r for v in node.values() for r in refs(v)
        ]
    return [r for v in node for r in refs(v)] if isinstance(node, list) else []


def test_the_conventions_in_the_document(spec: dict, ours: dict) -> None:
    assert ours["security"] == spec["security"] == [{"adminToken": []}]
    assert ours["components"]["securitySchemes"]["adminToken"]["scheme"] == "bearer"
    actor = ours["components"]["parameters"]["Actor"]
    assert (actor["name"], actor["in"], actor["required"]) == ("X-Llmgw-Actor", "header", False)
    assert "null" not in json.dumps(ours), "the document names null somewhere"
    for (method, path), op in operations(ours).items():
        assert op["responses"]["default"] == {"$ref": "#/components/responses/Error"}, (method, path)
        if method != "GET":
            assert {"$ref": "#/components/parameters/Actor"} in op["parameters"], (method, path)


def test_routes_beyond_the_spec_are_marked_as_extensions(spec: dict, ours: dict) -> None:
    extra = operations(ours).keys() - operations(spec).keys()
    for method, path in extra:
        op = operations(ours)[method, path]
        assert op.get("x-opod-extension") is True and op["tags"] == ["opod"], (method, path)
    for method, path in operations(spec):
        assert "x-opod-extension" not in operations(ours)[method, path]
