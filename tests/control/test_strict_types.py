"""Request bodies of ``/api/v1`` are checked, not coerced: a value of another JSON type than its field's is refused.

Built from the spec (``llmgw-admin-openapi.json``): every operation that takes a body is sent, field by field and
at every depth, values of each JSON type its field does not have, and must answer 400 naming each such field and
change nothing. Then the cases that used to be read as something the caller did not say (``"yes"`` as true, ``true``
as 1, ``"3"`` as version 3 with an empty settings body), and what an empty settings body means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.inprocess import InProcessLeader as Leader

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"
if not SPEC_PATH.is_file():
    pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})", allow_module_level=True)
SPEC = json.loads(SPEC_PATH.read_text())
SCHEMAS: dict[str, Any] = SPEC["components"]["schemas"]

WRONG: dict[str, list[Any]] = {
    "string": [7, True, 1.5, ["x"], {"x": "y"}],
    "integer": ["1", True, 1.5, [1], {"n": 1}],
    "number": ["1.5", True, [1], {"n": 1}],
    "boolean": ["yes", 1, "true", [True], {"b": True}],
    "array": ["x", 1, True, {"x": 1}],
    "object": ["x", 1, True, [1]],
}
"""Values of every JSON type but null (every field may be left out) that a field of each type must refuse."""
DEPTH = 4


def operations() -> list[tuple[str, str, str, str]]:
    """(operation id, method, path, body schema) of every operation with a JSON body."""
    found = []
    for path, methods in SPEC["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "$ref" in body:
                found.append((op["operationId"], method.upper(), path, body["$ref"].rsplit("/", 1)[-1]))
    return found


def kind(prop: dict[str, Any]) -> str | None:
    """The JSON type of a property, ``object`` for a schema it names; None for one of any type."""
    if "$ref" in prop:
        return "object"
    kind: str | None = prop.get("type")
    return kind


def wrong_body(schema: str, round_: int, prefix: str = "", depth: int = 0) -> tuple[dict[str, Any], set[str]]:
    """A body of ``schema`` whose every field holds a wrong value, and the names (dotted) the refusal must give.

    Round 0 goes into nested objects, arrays and maps, wrong inside them; later rounds put a wrong value of another
    type in each field itself, a different one each round.
    """
    body: dict[str, Any] = {}
    names: set[str] = set()
    for name, prop in SCHEMAS[schema].get("properties", {}).items():
        typ = kind(prop)
        if typ is None:
            continue  # any value is this field's type
        where = f"{prefix}{name}"
        inner = prop.get("items") if typ == "array" else prop.get("additionalProperties") if typ == "object" else None
        if round_ == 0 and depth < DEPTH and ("$ref" in prop or isinstance(inner, dict)):
            if "$ref" in prop:
                body[name], deeper = wrong_body(prop["$ref"].rsplit("/", 1)[-1], 0, where + ".", depth + 1)
                if deeper:
                    names |= deeper
                    continue
            else:
                assert isinstance(inner, dict)
                key = "0" if typ == "array" else "k"
                if "$ref" in inner:
                    value, deeper = wrong_body(inner["$ref"].rsplit("/", 1)[-1], 0, f"{where}.{key}.", depth + 1)
                else:
                    inner_kind = kind(inner)
                    if inner_kind is None:
                        value, deeper = None, set()
                    else:
                        value, deeper = WRONG[inner_kind][0], {f"{where}.{key}"}
                if deeper:
                    body[name] = [value] if typ == "array" else {key: value}
                    names |= deeper
                    continue
        choices = WRONG[typ]
        body[name] = choices[round_ % len(choices)] if round_ else choices[-1 if typ != "object" else 0]
        names.add(where)
    return body, names


def named(error: str) -> set[str]:
    """The fields a refusal names: ``a: send ...; b.c: send ...`` → {a, b.c}."""
    return {part.split(":", 1)[0].strip() for part in error.split("; ")}


def fill(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("strict") / "home")
    yield up
    up.stop()


OPERATIONS = operations()


def test_the_spec_has_the_operations_this_walks() -> None:
    assert len(OPERATIONS) > 50 and {o[0] for o in OPERATIONS} >= {"putSettings", "putPresetsAuto", "postKeys"}


@pytest.mark.parametrize(("operation", "method", "path", "schema"), OPERATIONS, ids=[o[0] for o in OPERATIONS])
def test_a_value_of_another_json_type_is_refused_naming_its_field(
    leader: Leader, operation: str, method: str, path: str, schema: str
) -> None:
    rounds = 1 + max(len(v) for v in WRONG.values())
    for round_ in range(rounds):
        body, names = wrong_body(schema, round_)
        if not names:
            continue
        status, answer = leader.admin(method, fill(path), body)
        assert status == 400, (operation, round_, body, answer)
        assert names <= named(answer["error"]), (operation, round_, sorted(names - named(answer["error"])), answer)


def test_the_refusal_says_what_to_send(leader: Leader) -> None:
    status, answer = leader.admin("PUT", "/api/v1/presets/auto", {"on": "yes"})
    assert (status, answer["error"]) == (400, "on: send a boolean (true or false), not a string")
    status, answer = leader.admin("POST", "/api/v1/keys", {"name": 7, "project": ["acme"]})
    assert (status, answer["error"]) == (
        400,
        "name: send a string, not a whole number; project: send a string, not an array",
    )


def test_yes_is_not_true_and_automatic_presets_stay_off(leader: Leader) -> None:
    before = leader.admin("GET", "/api/v1/presets")[1]["auto"]
    for sent in ("yes", "true", 1):
        status, answer = leader.admin("PUT", "/api/v1/presets/auto", {"on": sent})
        assert status == 400 and answer["error"].startswith("on: "), answer
    assert leader.admin("GET", "/api/v1/presets")[1]["auto"] == before is False


def test_true_is_not_a_minimum_of_one(leader: Leader) -> None:
    status, answer = leader.admin("POST", "/api/v1/models", {"name": "strict-tiny", "profiles": [{"engine": "sim"}]})
    assert status == 200, answer
    before = leader.admin("GET", "/api/v1/models/strict-tiny")[1]["scaling"]
    for field in ("min", "max"):
        status, answer = leader.admin("POST", "/api/v1/models/strict-tiny/scale", {field: True})
        assert status == 400 and answer["error"].startswith(f"{field}: send a whole number"), answer
    assert leader.admin("GET", "/api/v1/models/strict-tiny")[1]["scaling"] == before
    status, answer = leader.admin("POST", "/api/v1/models/strict-tiny/scale", {"min": 1, "max": 2})
    assert status == 200 and (answer["min"], answer["max"]) == (1, 2), answer  # numbers still are numbers


def test_a_version_as_text_is_refused_and_the_settings_stay(leader: Leader) -> None:
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": "retention: {requests_days: 3}\n"})
    assert status == 200, answer
    for sent in ({"base": "1", "body": ""}, {"base": 1.0, "body": ""}, {"base": True, "body": ""}):
        status, answer = leader.admin("PUT", "/api/v1/settings", sent)
        assert status == 400 and answer["error"].startswith("base: send a whole number"), (sent, answer)
    status, answer = leader.admin("POST", "/api/v1/settings/rollback", {"version": "1"})
    assert status == 400 and answer["error"].startswith("version: send a whole number"), answer
    newest = leader.admin("GET", "/api/v1/settings")[1]
    assert (newest["version"], newest["body"]) == (1, "retention: {requests_days: 3}\n")


def test_an_empty_settings_body_is_taken_only_with_its_base(leader: Leader) -> None:
    version = leader.admin("GET", "/api/v1/settings")[1]["version"]
    if not version:
        assert leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": "retention: {requests_days: 4}\n"})[0] == 200
        version = 1
    for sent in ({"body": ""}, {"body": "\n  \n"}, {"body": "", "note": "reset"}):
        status, answer = leader.admin("PUT", "/api/v1/settings", sent)
        assert status == 400, (sent, answer)
        assert answer["error"].startswith("body: empty, which puts every setting back to its default"), answer
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": version})
    assert status == 400 and answer["error"].startswith("body: missing"), answer
    assert leader.admin("GET", "/api/v1/settings")[1]["version"] == version  # nothing was written

    status, reset = leader.admin("PUT", "/api/v1/settings", {"base": version, "body": "", "note": "defaults"})
    assert status == 200 and (reset["version"], reset["body"]) == (version + 1, ""), reset


def test_times_and_fractions_still_parse_where_the_spec_types_them(leader: Leader) -> None:
    """A time is RFC 3339 text and a whole number is a number: neither is refused by the checks above."""
    leader.admin("POST", "/api/v1/models", {"name": "strict-timed", "profiles": [{"engine": "sim"}]})
    capacity = {"throughput_tok_per_sec": 120, "suggested_kv_ceiling": 0.85, "measured_at": "2026-09-01T12:00:00Z"}
    status, answer = leader.admin("PUT", "/api/v1/models/strict-timed/capacity", capacity)
    assert status == 200, answer
    assert (answer["throughput_tok_per_sec"], answer["measured_at"]) == (120.0, "2026-09-01T12:00:00Z")
    status, answer = leader.admin("PUT", "/api/v1/models/strict-timed/capacity", {**capacity, "measured_at": 1_700_000})
    assert (status, answer["error"]) == (400, "measured_at: send a time as RFC 3339 text, such as 2026-09-01T12:00:00Z")
