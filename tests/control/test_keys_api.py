"""API keys through the management API, on one real leader with a simulator worker serving a model.

A key for a project works with the ``openai`` package on ``/v1`` and stops at the next request once
revoked; the list never holds a secret; band, routing profile, project and person are checked and
shown; a lifetime longer than a scope above the key allows is refused; the keys that exist besides
(``opod token``'s, the auth file's) are in the same list; each change is in the audit log with it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import openai
import pytest

from opod.contract import adminapi
from tests.control.scim_support import new_user, scim
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
FILE_SECRET = "sk-opod-from-the-auth-file-" + os.urandom(6).hex()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Leader, OpodProcess]]:
    root = tmp_path_factory.mktemp("keys")
    auth = root / "auth.json"
    key = adminapi.SnapshotKey(
        id="billing",
        name="billing export",
        hash=hashlib.sha256(FILE_SECRET.encode()).hexdigest(),
        admission_class="sheddable",
    )
    auth.write_text(adminapi.AuthSnapshot(revision="1", require_keys=True, keys=[key]).to_json())
    leader = Leader(root / "leader", env={"OPOD_AUTH_FILE": str(auth)})
    worker = sim_worker(leader, root / "worker", "n_keys")
    worker.wait_for_line("registered with", timeout=30)
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
    for method, path, body in (
        ("POST", "/api/v1/orgs", {"name": "acme"}),
        ("POST", "/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("POST", "/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
        ("POST", "/api/v1/projects", {"name": "other", "in": "acme/ml"}),
    ):
        status, answer = leader.admin(method, path, body)
        assert status == 201, answer
    leader.wait_served(MODEL)
    yield leader, worker
    worker.stop()
    leader.stop()


def chat(leader: Leader, secret: str) -> str:
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    return answer.model


def create(leader: Leader, body: dict, status: int = 201) -> dict:
    got, answer = leader.admin("POST", "/api/v1/keys", body)
    assert got == status, answer
    assert isinstance(answer, dict)
    return answer


def keys(leader: Leader, query: str = "") -> list[dict]:
    status, answer = leader.admin("GET", "/api/v1/keys" + query)
    assert status == 200 and isinstance(answer, list), answer
    return answer


def audit_rows(leader: Leader) -> list[dict]:
    status, answer = leader.admin("GET", "/api/v1/audit?limit=10000")
    assert status == 200 and isinstance(answer, list), answer
    return answer


def test_a_project_key_works_on_v1_and_stops_at_once_when_revoked(fleet) -> None:
    leader, _ = fleet
    created = create(leader, {"name": "chat bot", "project": "acme/ml/chat", "band": "critical", "expires_in": "720h"})
    secret = created["secret"]
    assert secret.startswith("sk-opod-") and created["id"].startswith("k_")
    assert created["project"].startswith("prj_") and created["project_path"] == "acme/ml/chat"
    assert created["band"] == "critical" and created["state"] == "active" and "user" not in created
    assert abs(datetime.fromisoformat(created["expires_at"]) - (datetime.now(UTC) + timedelta(hours=720))) < timedelta(
        minutes=5
    )

    before_use = datetime.now(UTC)
    assert chat(leader, secret) == MODEL

    listed = {k["id"]: k for k in keys(leader, "?project=acme/ml/chat")}
    assert list(listed) == [created["id"]]
    # The key's use is written every few seconds: a listing made after that write says when, one made before not yet.
    used = listed[created["id"]].pop("last_used_at", None)
    assert listed[created["id"]] == {k: v for k, v in created.items() if k != "secret"}
    if used is not None:
        assert before_use - timedelta(seconds=1) <= datetime.fromisoformat(used) <= datetime.now(UTC)
    by_id = [
        {k: v for k, v in key.items() if k != "last_used_at"} for key in keys(leader, f"?project={created['project']}")
    ]
    assert by_id == list(listed.values())
    assert keys(leader, "?project=acme/ml/other") == []

    status, answer = leader.admin("DELETE", f"/api/v1/keys/{created['id']}")
    assert status == 200 and answer == {"id": created["id"], "revoked": True}
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        chat(leader, secret)
    status, answer = leader.admin("GET", f"/api/v1/keys/{created['id']}")
    assert status == 200 and answer["state"] == "revoked" and "secret" not in answer

    mine = [r for r in audit_rows(leader) if r.get("target") == f"key:{created['id']}"]
    assert sorted((r["action"], r["status"]) for r in mine) == [
        ("DELETE /api/v1/keys/{id}", 200),
        ("POST /api/v1/keys", 201),
    ]
    assert any(created["project"] in r.get("detail", "") and "critical" in r.get("detail", "") for r in mine)

    # A project that had a key keeps it, revoked: it is only renamed.
    status, answer = leader.admin("DELETE", f"/api/v1/projects/{created['project']}")
    assert status == 409 and "only be renamed" in answer["error"], answer


def test_no_listing_and_no_audit_row_ever_holds_a_secret(fleet) -> None:
    leader, _ = fleet
    secrets = [create(leader, {"name": f"k{i}", "project": "acme/ml/other"})["secret"] for i in range(2)]
    secrets.append(create(leader, {"name": "own"})["secret"])
    everything = json.dumps(keys(leader)) + json.dumps(
        [leader.admin("GET", f"/api/v1/keys/{k['id']}")[1] for k in keys(leader)]
    )
    everything += json.dumps(audit_rows(leader))
    for secret in secrets + [FILE_SECRET]:
        assert secret not in everything and secret[:20] not in everything
    assert all("secret" not in k for k in keys(leader))


def test_the_keys_that_exist_show_in_the_same_list_and_the_auth_files_are_read_only(fleet) -> None:
    leader, _ = fleet
    made = opod_cli(leader, "token", "create", "--name", "cli key")
    assert made.returncode == 0, made.stderr
    listed = {k["id"]: k for k in keys(leader)}
    assert any(k["name"] == "cli key" and "project" not in k for k in listed.values())
    billing = listed["k_cp_billing"]
    assert {k: v for k, v in billing.items() if k != "created_at"} == {
        "id": "k_cp_billing",
        "name": "billing export",
        "prefix": "",
        "state": "active",
        "band": "sheddable",
    }
    listing = opod_cli(leader, "token", "ls")
    assert listing.returncode == 0 and "k_cp_billing" in listing.stdout and "cli key" in listing.stdout, listing.stderr
    assert chat(leader, FILE_SECRET) == MODEL
    status, answer = leader.admin("DELETE", "/api/v1/keys/k_cp_billing")
    assert status == 409 and "auth file" in answer["error"], answer
    assert chat(leader, FILE_SECRET) == MODEL
    status, answer = leader.admin("GET", "/api/v1/keys/k_cp_billing")
    assert status == 200 and answer["id"] == "k_cp_billing"


def test_band_routing_profile_project_and_person_are_checked(fleet) -> None:
    leader, _ = fleet

    def refused(body: dict, status: int) -> str:
        answer = create(leader, body, status)
        assert set(answer) == {"error"}, answer
        return answer["error"]

    message = refused({"band": "gold"}, 400)
    assert message.startswith("band:") and "critical, standard, sheddable" in message
    message = refused({"routing_profile": "fastest"}, 400)
    assert message.startswith("routing_profile:") and "default" in message
    assert refused({"project": "acme/ml/nope"}, 404).startswith("project:")
    assert refused({"project": "not a path"}, 400).startswith("project:")
    assert refused({"user": "nobody@example.com"}, 404).startswith("user:")
    assert refused({"expires_in": "forever"}, 400).startswith("expires_in:")
    created = create(leader, {"band": "sheddable", "routing_profile": "default"})
    assert (created["band"], created["routing_profile"]) == ("sheddable", "default")
    assert not [k for k in keys(leader) if k["name"] == "api key" and k.get("band") == "gold"]


def test_a_lifetime_longer_than_a_scope_above_allows_is_refused(fleet) -> None:
    leader, _ = fleet
    status, current = leader.admin("GET", "/api/v1/settings")
    assert status == 200, current
    body = "keys:\n  max_lifetime: 2160h\n  scopes:\n    team:acme/ml: 24h\n"
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, answer

    def refusal() -> str:
        got, answer = leader.admin("POST", "/api/v1/keys", {"project": "acme/ml/chat", "expires_in": "48h"})
        return answer["error"] if got == 400 else ""

    message = wait_until(refusal, 10, "the key rules to be in force")
    assert message.startswith("expires_in:") and "team acme/ml" in message and "24h" in message
    bounded = create(leader, {"project": "acme/ml/chat"})  # no lifetime asked: it ends where the team says
    assert datetime.fromisoformat(bounded["expires_at"]) <= datetime.now(UTC) + timedelta(hours=24)
    assert create(leader, {"project": "acme/ml/chat", "expires_in": "12h"})["state"] == "active"
    message = create(leader, {"expires_in": "3000h"}, 400)["error"]
    assert "the cluster" in message and "2160h" in message
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0) + 1, "body": ""})
    assert status == 200, answer


def test_a_persons_key_only_in_a_project_they_belong_to(fleet) -> None:
    leader, _ = fleet
    token = "scim-" + os.urandom(8).hex()
    assert leader.admin("PUT", "/api/v1/auth/secrets/scim-token", {"value": token})[0] == 200
    status, _, person = scim(leader, "POST", "/Users", new_user("grace@example.com", "Grace Hopper"), token)
    assert status == 201, person
    assert isinstance(person, dict)

    refused = create(leader, {"project": "acme/ml/chat", "user": "grace@example.com"}, 403)["error"]
    assert refused.startswith("user:") and "not a member of project acme/ml/chat" in refused
    status, answer = leader.admin("POST", f"/api/v1/users/{person['id']}/memberships", {"target": "team:acme/ml"})
    assert status == 200, answer
    key = create(leader, {"project": "acme/ml/chat", "user": "GRACE@example.com"})
    assert (key["user"], key["user_email"], key["project_path"]) == (person["id"], "grace@example.com", "acme/ml/chat")
    own = create(leader, {"user": person["id"], "name": "grace's own"})
    assert own["user"] == person["id"] and "project" not in own
    assert chat(leader, key["secret"]) == MODEL


def test_a_key_takes_a_routing_profile_the_settings_define(fleet) -> None:
    leader, _ = fleet
    assert create(leader, {"routing_profile": "sticky"}, 400)["error"].startswith("routing_profile:")
    status, current = leader.admin("GET", "/api/v1/settings")
    assert status == 200, current
    body = (current.get("body") or "") + "\nrouting_profiles:\n  sticky: {prefix_affinity: true, kv_weight: 0.5}\n"
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, answer

    def made() -> dict | None:
        got, answer = leader.admin("POST", "/api/v1/keys", {"routing_profile": "sticky"})
        return answer if got == 201 and isinstance(answer, dict) else None

    created = wait_until(made, 5, "the settings' routing profile to be in force")
    assert created["routing_profile"] == "sticky"
    assert chat(leader, created["secret"]) == MODEL
