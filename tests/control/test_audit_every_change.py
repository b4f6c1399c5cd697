"""Every refused change is in the audit: each mutating operation of the management API (every POST, PUT, PATCH and
DELETE of the spec, and opod's own, tagged ``opod`` in its document) is sent a request it must refuse, and
``GET /api/v1/audit`` must then hold the row of that refusal: its status, its action (``METHOD /api/v1/path/{template}``)
and its actor (``X-Llmgw-Actor``).

The refusal is one that reaches the operation where the operation can refuse something: an id that names nothing,
a value the area refuses, a stale base. An operation whose area is not built yet answers 501 for what it would
take and is sent what it will refuse when built (an unknown field, an unknown id). An operation that takes nothing
to refuse (``POST /api/v1/agents/restart``, ``POST /api/v1/notify/test``) is refused by the listener itself: a
change sent without a JSON ``Content-Type``. The spec is read from ``../shared/spec``; a leader built in the test's
process answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.inprocess import InProcessLeader as Leader

SPEC_PATH = Path(__file__).resolve().parents[3] / "shared" / "spec" / "llmgw-admin-openapi.json"
CHANGES = ("post", "put", "patch", "delete")
UNKNOWN = {"no_such_field": 1}
"""A field no body of the API has: refused (400) by every operation that takes a body."""
SOON = (404, 501)
"""An unknown id sent to an operation of an area not built yet: 501 now, 404 once the area is built."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """What is sent (``path`` with its ids filled in, ``body`` as JSON) and the statuses it may be refused with."""

    path: str
    body: object = None
    status: tuple[int, ...] = (404,)
    content_type: str = "application/json"


WALK: dict[str, Refusal] = {
    # Refused by the listener alone: these operations take no body and no id.
    "postAgentsRestart": Refusal("/api/v1/agents/restart", status=(415,), content_type="text/plain"),
    "postNotifyTest": Refusal("/api/v1/notify/test", status=(415,), content_type="text/plain"),
    # Access: keys, node tokens, secrets, people.
    "postKeys": Refusal("/api/v1/keys", {"name": "walk", "band": "gold"}, (400,)),
    "deleteKeysId": Refusal("/api/v1/keys/k_nope"),
    "postNodeTokens": Refusal("/api/v1/node-tokens", {"name": 5}, (400,)),
    "deleteNodeTokensId": Refusal("/api/v1/node-tokens/nt_nope"),
    "putAuthSecretsName": Refusal("/api/v1/auth/secrets/scim-token", {"value": 7}, (400,)),
    "postAccounts": Refusal("/api/v1/accounts", {"email": "walk@example.com", "password": "short"}, (400,)),
    "putAccountsIdPassword": Refusal("/api/v1/accounts/u_nope/password", {"password": "long enough walk"}),
    "putAccountsId": Refusal("/api/v1/accounts/u_nope", {"role": "admin"}),
    "postAuthLdapTest": Refusal("/api/v1/auth/ldap/test", UNKNOWN, (400,)),
    "postUsersIdMemberships": Refusal("/api/v1/users/u_nope/memberships", {"target": "team:acme/ml"}),
    "deleteUsersIdMemberships": Refusal("/api/v1/users/u_nope/memberships", {"target": "team:acme/ml"}),
    # Tenancy.
    "postOrgs": Refusal("/api/v1/orgs", {"name": "Not A Name!"}, (400,)),
    "patchOrgsId": Refusal("/api/v1/orgs/org_0000000000000000", {"name": "other"}),
    "deleteOrgsId": Refusal("/api/v1/orgs/org_0000000000000000"),
    "postTeams": Refusal("/api/v1/teams", {"name": "ml", "in": "nope"}),
    "patchTeamsId": Refusal("/api/v1/teams/team_0000000000000000", {"name": "other"}),
    "deleteTeamsId": Refusal("/api/v1/teams/team_0000000000000000"),
    "postProjects": Refusal("/api/v1/projects", {"name": "chat", "in": "nope/nope"}),
    "patchProjectsId": Refusal("/api/v1/projects/prj_0000000000000000", {"name": "other"}),
    "deleteProjectsId": Refusal("/api/v1/projects/prj_0000000000000000"),
    "putQuotas": Refusal("/api/v1/quotas", {"scope": "org:nope", "limit": {"gpus": 1}}),
    "deleteQuotasScope": Refusal("/api/v1/quotas/org:nope"),
    # The catalog.
    "postModels": Refusal("/api/v1/models", {"name": "walk-model", "source": "acme/x", "class": "gold"}, (400,)),
    "deleteModelsName": Refusal("/api/v1/models/nope-model"),
    "postModelsNameScale": Refusal("/api/v1/models/nope-model/scale", {"min": 1}),
    "postModelsNameClass": Refusal("/api/v1/models/nope-model/class", {"class": "standard"}),
    "postModelsNameOwner": Refusal("/api/v1/models/nope-model/owner", {"owner": ""}),
    "postModelsNameResources": Refusal("/api/v1/models/nope-model/resources", {"profile": "cpu", "memory_gb": 1}),
    "putModelsNameCapacity": Refusal("/api/v1/models/nope-model/capacity", {"throughput_tok_per_sec": 1}),
    "postModelsNameRetry": Refusal("/api/v1/models/nope-model/retry"),
    "postModelsNameLoad": Refusal("/api/v1/models/nope-model/load", {}),
    "postModelsNameUnload": Refusal("/api/v1/models/nope-model/unload", {}),
    "putPresetsAuto": Refusal("/api/v1/presets/auto", UNKNOWN, (400,)),
    "postPresetsName": Refusal("/api/v1/presets/nope-preset"),
    "postRestart": Refusal("/api/v1/restart", {"models": ["nope-model"]}),
    # Rollouts, adapters and evaluations of models.
    "postModelsServe": Refusal("/api/v1/models/serve", UNKNOWN, (400,)),
    "postModelsNameAdapters": Refusal("/api/v1/models/nope-model/adapters", UNKNOWN, (400,)),
    "postModelsNameCanary": Refusal("/api/v1/models/nope-model/canary", UNKNOWN, (400,)),
    "putModelsNameCanary": Refusal("/api/v1/models/nope-model/canary", UNKNOWN, (400,)),
    "deleteModelsNameCanary": Refusal("/api/v1/models/nope-model/canary", status=SOON),
    "postModelsNameEval": Refusal("/api/v1/models/nope-model/eval", UNKNOWN, (400,)),
    "putModelsNameEvalGate": Refusal("/api/v1/models/nope-model/eval-gate", UNKNOWN, (400,)),
    "deleteModelsNameEvalGate": Refusal("/api/v1/models/nope-model/eval-gate", status=SOON),
    "putModelsNameFallbacks": Refusal("/api/v1/models/nope-model/fallbacks", UNKNOWN, (400,)),
    "postModelsNameOrigin": Refusal("/api/v1/models/nope-model/origin", UNKNOWN, (400,)),
    "postModelsNamePromote": Refusal("/api/v1/models/nope-model/promote", UNKNOWN, (400,)),
    "postModelsNameRollback": Refusal("/api/v1/models/nope-model/rollback", status=SOON),
    "postModelsNameUpdate": Refusal("/api/v1/models/nope-model/update", UNKNOWN, (400,)),
    "postUpdatesCheck": Refusal("/api/v1/updates/check", UNKNOWN, (400,)),
    # Nodes and their weights.
    "deleteNodesId": Refusal("/api/v1/nodes/n_nope"),
    "postNodesIdState": Refusal("/api/v1/nodes/n_nope/state", {"state": "drain"}),
    "postNodesIdLabels": Refusal("/api/v1/nodes/n_nope/labels", {"set": {"team": "search"}}),
    "postNodesIdEngines": Refusal("/api/v1/nodes/n_nope/engines", {"engine": "llamacpp", "build": "portable"}),
    "postNodesIdUpgrade": Refusal("/api/v1/nodes/n_nope/upgrade", {"version": "9.9.9"}),
    "postWeightsCollect": Refusal("/api/v1/weights/collect", {"node": "n_nope"}),
    # Settings, requests, metrics, client jobs.
    "putSettings": Refusal("/api/v1/settings", {"base": 7, "body": ""}, (409,)),
    "postSettingsRollback": Refusal("/api/v1/settings/rollback", {"version": 42}),
    "postRequestsIdReplay": Refusal("/api/v1/requests/r_nope/replay", {}),
    "postMetricsRange": Refusal("/api/v1/metrics/range", {"window": 60_000_000_000, "step": 0, "queries": []}, (400,)),
    "postClientJobsIdCancel": Refusal("/api/v1/client-jobs/batch_nope/cancel"),
    # Guard attachments: a policy the settings do not have; a target that names nothing.
    "postGuardAttachments": Refusal("/api/v1/guard/attachments", {"target": "org:nope", "policy": "nope"}, (400,)),
    "deleteGuardAttachments": Refusal("/api/v1/guard/attachments", {"target": "org:nope", "policy": "pii"}),
    # Areas not built yet: fabrics, facility, federation, guard judges, knowledge bases, training.
    "postFabricTest": Refusal("/api/v1/fabric-test", UNKNOWN, (400,)),
    "postFacilityHolds": Refusal("/api/v1/facility/holds", UNKNOWN, (400,)),
    "deleteFacilityHoldsDomain": Refusal("/api/v1/facility/holds/nope-domain", status=SOON),
    "postFederation": Refusal("/api/v1/federation", UNKNOWN, (400,)),
    "deleteFederationPeer": Refusal("/api/v1/federation/nope-peer", status=SOON),
    "postFederationPeerSync": Refusal("/api/v1/federation/nope-peer/sync", status=SOON),
    "postGuardJudgesAsk": Refusal("/api/v1/guard/judges/ask", UNKNOWN, (400,)),
    "postKbCollections": Refusal("/api/v1/kb/collections", UNKNOWN, (400,)),
    "deleteKbCollectionsId": Refusal("/api/v1/kb/collections/kb_nope", status=SOON),
    "postKbCollectionsIdDataset": Refusal("/api/v1/kb/collections/kb_nope/dataset", UNKNOWN, (400,)),
    "deleteKbCollectionsIdDocuments": Refusal("/api/v1/kb/collections/kb_nope/documents?name=nope.md", status=SOON),
    "postKbDefaults": Refusal("/api/v1/kb/defaults", UNKNOWN, (400,)),
    "postKbGrants": Refusal("/api/v1/kb/grants", UNKNOWN, (400,)),
    "deleteKbGrants": Refusal("/api/v1/kb/grants", UNKNOWN, (400,)),
    "postKbSearch": Refusal("/api/v1/kb/search", UNKNOWN, (400,)),
    "postTrainJobs": Refusal("/api/v1/train/jobs", UNKNOWN, (400,)),
    "deleteTrainJobsId": Refusal("/api/v1/train/jobs/job_nope", status=SOON),
    "postTrainJobsIdCancel": Refusal("/api/v1/train/jobs/job_nope/cancel", status=SOON),
    "postTrainJobsIdPublish": Refusal("/api/v1/train/jobs/job_nope/publish", status=SOON),
}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    if not SPEC_PATH.is_file():
        pytest.skip(f"the management API's specification is not beside the clone ({SPEC_PATH})")
    return json.loads(SPEC_PATH.read_text())


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("audit-walk") / "home")
    yield up
    up.stop()


@pytest.fixture(scope="module")
def operations(spec: dict[str, Any], leader: Leader) -> dict[str, tuple[str, str]]:
    """operationId → (METHOD, path template) of every mutating operation: the spec's, and opod's own."""
    status, ours = leader.admin("GET", "/api/v1/openapi.json")
    assert status == 200 and isinstance(ours, dict), ours
    found = {}
    for document, only_opod in ((spec, False), (ours, True)):
        for path, item in document["paths"].items():
            for method, operation in item.items():
                if method in CHANGES and (not only_opod or "opod" in operation.get("tags", [])):
                    found[operation["operationId"]] = (method.upper(), path)
    return found


def test_every_mutating_operation_is_walked(operations: dict[str, tuple[str, str]]) -> None:
    assert sorted(set(operations) - set(WALK)) == [], "operations with no refusal to walk: add them to WALK"
    assert sorted(set(WALK) - set(operations)) == [], "refusals of operations that are not in the spec or the document"
    for operation_id, (_, template) in operations.items():
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^?]+", re.escape(template))
        assert re.fullmatch(pattern + r"(\?.*)?", WALK[operation_id].path), (operation_id, template)


@pytest.mark.parametrize("operation_id", sorted(WALK))
def test_a_refused_change_is_in_the_audit_with_its_status_action_and_actor(
    leader: Leader, operations: dict[str, tuple[str, str]], operation_id: str
) -> None:
    method, template = operations[operation_id]
    refusal = WALK[operation_id]
    actor = f"walk-{operation_id}"
    answer = leader.request(
        method, refusal.path, refusal.body, headers={"X-Llmgw-Actor": actor, "Content-Type": refusal.content_type}
    )
    assert answer.status_code in refusal.status, (answer.status_code, answer.text)
    body = answer.json()
    assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body

    status, rows = leader.admin("GET", f"/api/v1/audit?actor={actor}")
    assert status == 200 and isinstance(rows, list), rows
    assert [(r["action"], r["status"], r["actor"], r["source"]) for r in rows] == [
        (f"{method} {template}", answer.status_code, actor, "api")
    ], f"{method} {refusal.path} answered {answer.status_code} and left {rows}"
