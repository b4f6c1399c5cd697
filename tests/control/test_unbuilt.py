"""Every operation of the management API's specification is routed: by a built area, or by the table of operations
not built yet (``opod.control.unbuilt.UNBUILT``), never both; each of the latter answers 501 naming its area."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from opod.control.areas import admin_areas
from opod.control.unbuilt import UNBUILT
from tests.support.inprocess import InProcessLeader

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"
if not SPEC_PATH.is_file():
    pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})", allow_module_level=True)


def spec_operations() -> dict[tuple[str, str], str]:
    spec = json.loads(SPEC_PATH.read_text())
    return {
        (method.upper(), path): op["operationId"]
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in ("get", "put", "post", "delete", "patch")
    }


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    up = InProcessLeader(tmp_path_factory.mktemp("unbuilt") / "home")
    yield up
    up.stop()


def built(leader: InProcessLeader) -> dict[tuple[str, str], str]:
    """(method, path) → operation id of every route the built areas have, as the document writes its path."""
    out = {("GET", "/api/v1/openapi.json"): "getOpenapiJson"}  # the document, served by the app itself
    for area in admin_areas(leader.leader.control):
        for route in area.routes:
            assert isinstance(route, APIRoute)
            for method in route.methods:
                out[(method, route.path.replace(":path}", "}"))] = route.operation_id or ""
    return out


def test_every_operation_of_the_spec_is_built_or_in_the_unbuilt_table_and_never_both(leader: InProcessLeader) -> None:
    spec = spec_operations()
    areas = built(leader)
    table = {(op.method, op.path): op.operation_id for op in UNBUILT}
    assert not set(table) & set(areas), f"built and still in the unbuilt table: {sorted(set(table) & set(areas))}"
    missing = {key: op for key, op in spec.items() if key not in areas and key not in table}
    assert not missing, f"operations of the spec neither built nor in the unbuilt table: {missing}"
    extra = {key: op for key, op in table.items() if key not in spec}
    assert not extra, f"rows of the unbuilt table the spec does not have: {extra}"
    wrong_ids = {
        key: (table.get(key) or areas[key], op) for key, op in spec.items() if (table.get(key) or areas[key]) != op
    }
    assert not wrong_ids, f"operation ids that differ from the spec's (ours, spec's): {wrong_ids}"


def test_every_unbuilt_operation_answers_501_naming_its_area(leader: InProcessLeader) -> None:
    for op in UNBUILT:
        path = op.path.replace("{", "").replace("}", "")  # any value for a path parameter
        query = "&".join(f"{name}=x" for name, kind in op.query if type(None) not in getattr(kind, "__args__", ()))
        body = {} if op.body is not None else None
        response = leader.request(op.method, path + (f"?{query}" if query else ""), body)
        assert response.status_code == 501, (op.operation_id, response.status_code, response.text)
        assert response.json() == {"error": response.json()["error"]}, response.text
        assert f"the management API's {op.area} yet" in response.json()["error"], response.text
