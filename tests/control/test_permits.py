"""Every operation of the management API has the action a session needs for it, and the table names nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from opod.access.permissions import ROLES, Action
from opod.control.permits import BY_TAG, OPERATIONS, action_for
from tests.support.inprocess import InProcessLeader

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"
if not SPEC_PATH.is_file():
    pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})", allow_module_level=True)


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    up = InProcessLeader(tmp_path_factory.mktemp("permits") / "home")
    yield up
    up.stop()


def spec_operations() -> dict[str, tuple[str, str]]:
    """operation id → (method, tag) of every operation of the spec."""
    spec = json.loads(SPEC_PATH.read_text())
    return {
        op["operationId"]: (method.upper(), op["tags"][0])
        for item in spec["paths"].values()
        for method, op in item.items()
        if method in ("get", "put", "post", "delete", "patch")
    }


def app_operations(leader: InProcessLeader) -> dict[str, tuple[str, str]]:
    """operation id → (method, tag) of every /api route the admin app answers (the spec's and opod's own)."""
    return {
        route.operation_id: (method, str((route.tags or [""])[0]))
        for route in _leaves(leader.up.listeners[1].app.routes)
        if isinstance(route, APIRoute) and route.operation_id and route.path.startswith("/api/")
        for method in route.methods
    }


def _leaves(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, those of included routers too (FastAPI may keep an included router whole)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        yield from (_leaves(included.routes) if included is not None else [route])


def test_every_operation_of_the_spec_and_of_the_app_has_its_action(leader: InProcessLeader) -> None:
    operations = {**spec_operations(), **app_operations(leader)}
    missing = {op: how for op, how in operations.items() if action_for(op, how[1], how[0]) is None}
    assert missing == {}, "operations no session may call for want of a row: add them to BY_TAG or OPERATIONS"
    assert sorted(set(OPERATIONS) - set(operations)) == [], "rows of OPERATIONS that name no operation"
    assert sorted(set(BY_TAG) - {tag for _, tag in operations.values()}) == [], "rows of BY_TAG that name no tag"


def test_the_roles_nest_as_the_rule_says() -> None:
    assert ROLES["viewer"] < ROLES["operator"] < ROLES["admin"] and ROLES["viewer"] <= ROLES["billing"]
    assert Action.OPERATE not in ROLES["billing"] and Action.ADMINISTER not in ROLES["operator"]
    assert action_for("getRequestsIdBody", "requests", "GET") is Action.ADMINISTER
    assert action_for("postNodesIdState", "nodes", "POST") is Action.OPERATE
    assert action_for("getNodes", "nodes", "GET") is Action.READ
