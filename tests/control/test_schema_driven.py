"""The management API against its specification, driven by the spec itself (schemathesis).

For every operation of ``../shared/spec/llmgw-admin-openapi.json``, requests generated from the spec's schemas
(valid ones, and invalid ones) are sent to a leader built in the test's process whose local worker (as ``opod up``
has) runs the simulator and serves the two default models, so the fleet and catalog routes have data. Every answer
must be one the spec allows: no 5xx, the declared content type, a body that validates against the operation's
schema, and every refusal an ``ErrorView`` (``{"error": "..."}``, nothing else). The operations of areas not built
yet (the table ``opod.control.unbuilt.UNBUILT``, each answering 501: ``tests/control/test_unbuilt.py``) are left out,
so the test grows by itself as areas are built. Generated names and ids match nothing, so every other request of a read, and of a write
that only changes what a model or node is described by, names the fixture's real node, model or key instead: those
operations are driven past their 404s into their answers.

Left out, and why: ``postAgentsRestart`` and ``postRestart`` restart the fixture's worker agent and its model
replicas, which would change what every operation after them sees; they have tests of their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra: pip install -e '.[test]'")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from opod.control.unbuilt import UNBUILT  # noqa: E402
from tests.support.hubserver import HubServer  # noqa: E402
from tests.support.inprocess import InProcessLeader as Leader  # noqa: E402
from tests.support.opod_process import wait_until  # noqa: E402

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"
if not SPEC_PATH.is_file():
    pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})", allow_module_level=True)

DISRUPTIVE = ("postAgentsRestart", "postRestart")
"""Operations left out: they restart the fixture's agent or replicas (see the module's docstring)."""
EXAMPLES = 12
"""Generated requests per operation and mode: enough to reach the refusals, and the run stays within minutes."""
DEFAULT_MODELS = ("smollm2-135m-instruct", "all-minilm-l6-v2")
REPO = "acme/tiny-GGUF"
"""The loopback Hub's repository, named by every other request of ``plan``."""
REAL_WRITES = (
    "postNodesIdLabels",
    "postModelsNameOwner",
    "postModelsNameClass",
    "putModelsNameCapacity",
    "postModelsNameRetry",
    "putModelsNameEvalGate",
    "postModelsNameAdapters",
)
"""Writes sent with a real node or model as well: they change descriptions, never whether the fixture serves."""

schema = schemathesis.openapi.from_path(SPEC_PATH).exclude(
    operation_id=[*DISRUPTIVE, *(op.operation_id for op in UNBUILT)]
)
schema.config.generation.update(modes=["positive", "negative"], max_examples=EXAMPLES)

sent: dict[str, int] = {}
"""operationId → requests sent, to alternate generated and real names."""


@schemathesis.check
def error_view(ctx: Any, response: Any, case: Any) -> None:
    """Every refusal and every error of the admin listener is ``{"error": "<what went wrong>"}`` and nothing else."""
    if response.status_code < 400:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} answered {response.content[:200]!r}, not an ErrorView") from None
    if not (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str) and body["error"]):
        raise AssertionError(f'{response.status_code} answered {body!r}, not an ErrorView {{"error": "..."}}')


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    error_view,
]


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    """The registry ``plan`` and ``models/serve`` read: a loopback Hub with one small GGUF repository."""
    with HubServer().running_in_thread() as server:
        server.add_tiny_gguf(REPO)
        yield server


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory, hub: HubServer) -> Iterator[Leader]:
    home = tmp_path_factory.mktemp("schema-driven") / "home"
    up = Leader(home, default_models=True, worker="sim", env={"HF_ENDPOINT": hub.url})
    try:
        up.wait_served(*DEFAULT_MODELS)
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def real(leader: Leader) -> dict[str, str]:
    """Path parameter → a value naming something the fixture has: its worker, a served model, an API key."""
    nodes = wait_until(lambda: leader.admin("GET", "/api/v1/nodes")[1], 30, "the local worker in /api/v1/nodes")
    status, key = leader.admin("POST", "/api/v1/keys", {"name": "schema-driven"})
    assert status == 201 and isinstance(key, dict), key
    return {"node": nodes[0]["id"], "model": DEFAULT_MODELS[0], "key": key["id"]}


@pytest.fixture(scope="module")
def routed(leader: Leader) -> set[str]:
    """``METHOD path`` of every operation the leader routes, from its own document."""
    status, document = leader.admin("GET", "/api/v1/openapi.json")
    assert status == 200 and isinstance(document, dict), document
    return {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}


def _name_real_things(case: Any, operation: str, real: dict[str, str]) -> None:
    path = case.operation.path
    if not case.path_parameters or (case.method != "GET" and operation not in REAL_WRITES):
        return
    if path.startswith("/api/v1/nodes/{id}"):
        case.path_parameters["id"] = real["node"]
    elif path.startswith(("/api/v1/models/{name}", "/api/v1/presets/{name}")):
        case.path_parameters["name"] = real["model"]
    elif path == "/api/v1/keys/{id}":
        case.path_parameters["id"] = real["key"]


@pytest.fixture(scope="module")
def session() -> Iterator[Any]:
    import requests

    with requests.Session() as http_session:
        yield http_session


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_every_answer_is_one_the_spec_allows(
    case: Any, leader: Leader, session: Any, real: dict[str, str], routed: set[str]
) -> None:
    operation = case.operation.definition.raw.get("operationId", case.operation.label)
    assert f"{case.operation.method.upper()} {case.operation.path}" in routed, f"{operation} is not routed"
    sent[operation] = sent.get(operation, 0) + 1
    if sent[operation] % 2 == 0:
        _name_real_things(case, operation, real)
        if operation == "getPlan" and case.query:
            case.query["repo"] = REPO
    headers = {
        "Authorization": f"Bearer {leader.key}",
        "Content-Type": "application/json",
        "Host": "127.0.0.1",
        "X-Llmgw-Actor": "schemathesis",  # the actor's own refusals are tested in test_admin_listener
    }
    response = case.call(base_url=leader.admin_url, session=session, headers=headers, timeout=30)
    assert response.status_code != 501, f"{operation} answers 501 but is not in the unbuilt table: {response.text}"
    case.validate_response(response, checks=CHECKS)
