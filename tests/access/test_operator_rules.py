"""The rules of the management API's access areas, without HTTP: keys, memberships, sign-in secrets, the tree.

Each service is built on a real SQLite store, as the leader builds it; each change is checked in the store, in
memory (what the gateway reads) and in the audit, and each refusal leaves the three as they were.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from opod.access.keys import KeyOrder, KeyService
from opod.access.members import Memberships
from opod.access.people import People
from opod.access.secrets import AuthSecrets
from opod.access.service import AccessService
from opod.access.tenancy import Tenancy
from opod.http.errors import Unauthorized
from opod.security.nodetokens import NodeTokenMinter
from opod.security.sealing import SecretsKey
from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings
from opod.store import Conflict, InvalidInput, NotFound, Store
from opod.store.audit import AuditDraft
from opod.store.errors import Forbidden


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    sealing = SecretsKey(Fernet.generate_key(), tmp_path / "secrets.key")
    with Store.open(None, home=tmp_path, secrets_key=sealing) as opened:
        yield opened


class World:
    """The access side of a leader, as ``Leader.open`` builds it, with an organization acme, team ml, project chat."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.access = AccessService.load(store, NodeTokenMinter(secrets.token_bytes(32)))
        self.people = People.load(store, self.access)
        self.tenancy = Tenancy.load(store, self.people)
        self.settings = SettingsHolder(store)
        self.keys = KeyService(self.access, self.tenancy, self.settings)
        self.members = Memberships(self.people, self.tenancy, self.access)
        self.secrets = AuthSecrets(store, self.settings)

    async def tree(self) -> None:
        await self.tenancy.create("org", "acme", None)
        await self.tenancy.create("team", "ml", "acme")
        self.chat = (await self.tenancy.create("project", "chat", "acme/ml")).id
        self.ops = (await self.tenancy.create("project", "ops", "acme/ml")).id

    def draft(self, action: str = "POST /api/v1/keys") -> AuditDraft:
        return AuditDraft(actor="alice", source="api", action=action)

    def rows(self) -> list[tuple[str, dict[str, object]]]:
        return [(r.target, json.loads(r.detail) if r.detail else {}) for r in reversed(self.store.list_audit())]


@pytest.fixture
async def world(store: Store) -> World:
    made = World(store)
    await made.tree()
    return made


# --- keys ------------------------------------------------------------------------------------------


async def test_a_key_is_stored_with_its_row_and_admitted_at_once(world: World) -> None:
    draft = world.draft()
    record, secret = await world.keys.create("api", KeyOrder(name="app", project="acme/ml/chat"), audit=draft)
    assert world.access.keys.check(f"Bearer {secret}").id == record.id
    assert (await world.access.get_key(record.id)).project_id == world.chat
    assert world.tenancy.projects[0].had_key  # the tree knows, for a project's removal
    assert draft.committed
    target, detail = world.rows()[-1]
    assert target == f"key:{record.id}" and detail["project"] == world.chat and secret not in json.dumps(detail)


@pytest.mark.parametrize(
    ("kind", "order", "error", "refusal"),
    [
        ("node", KeyOrder(project="acme/ml/chat"), InvalidInput, "^project, user, band, routing_profile: a node token"),
        ("api", KeyOrder(band="vip"), InvalidInput, "^band: 'vip' is not an admission class"),
        ("api", KeyOrder(routing_profile="fast"), InvalidInput, "^routing_profile: 'fast' is not a routing profile"),
        ("api", KeyOrder(project="acme/ml/nope"), NotFound, "^project: no project 'acme/ml/nope'"),
        ("api", KeyOrder(user="nobody@example.com"), NotFound, "^user: no person 'nobody@example.com'"),
        ("api", KeyOrder(expires_in="soon"), InvalidInput, "^expires_in: 'soon' is not a lifetime"),
        ("api", KeyOrder(expires_in="0s"), InvalidInput, "^expires_in: a lifetime must be longer than zero"),
    ],
)
async def test_a_key_against_the_rules_is_refused_and_nothing_is_kept(
    world: World, kind: str, order: KeyOrder, error: type[Exception], refusal: str
) -> None:
    draft = world.draft()
    with pytest.raises(error, match=refusal):
        await world.keys.create(kind, order, audit=draft)  # type: ignore[arg-type]
    assert world.store.list_keys(kind) == [] and not draft.committed and world.rows() == []


async def test_a_persons_key_needs_a_membership_and_an_active_person(world: World) -> None:
    ada = await world.people.create(email="ada@example.com")
    with pytest.raises(Forbidden, match="^user: ada@example.com is not a member of project acme/ml/chat"):
        await world.keys.create("api", KeyOrder(project="acme/ml/chat", user="ada@example.com"), audit=world.draft())
    await world.members.join("ada@example.com", "team:acme/ml", None, audit=world.draft("POST m"))
    record, _ = await world.keys.create("api", KeyOrder(project=world.chat, user=ada.id), audit=world.draft())
    assert (record.user_id, record.project_id) == (ada.id, world.chat)

    await world.people.update(ada.id, state="disabled")
    with pytest.raises(Conflict, match="^user: ada@example.com is deactivated"):
        await world.keys.create("api", KeyOrder(user="ada@example.com"), audit=world.draft())
    assert len(world.store.list_keys("api")) == 1


async def test_a_keys_lifetime_is_bounded_by_every_scope_above_it(world: World) -> None:
    rules = {"keys": {"max_lifetime": "2160h", "scopes": {"team:acme/ml": "24h"}}}
    world.settings.apply(1, ClusterSettings.model_validate(rules))

    with pytest.raises(InvalidInput, match=r"^expires_in: 48h is longer than team acme/ml \(settings keys.scopes\)"):
        await world.keys.create("api", KeyOrder(project="acme/ml/chat", expires_in="48h"), audit=world.draft())
    with pytest.raises(InvalidInput, match=r"longer than the cluster \(settings keys.max_lifetime\) allows.*2160h"):
        await world.keys.create("api", KeyOrder(expires_in="3000h"), audit=world.draft())
    bounded, _ = await world.keys.create("api", KeyOrder(project="acme/ml/chat"), audit=world.draft())
    assert bounded.expires_at is not None and bounded.expires_at <= datetime.now(UTC) + timedelta(hours=24)
    longer, _ = await world.keys.create("api", KeyOrder(expires_in="100h"), audit=world.draft())
    assert longer.expires_at is not None and longer.expires_at > datetime.now(UTC) + timedelta(hours=99)


async def test_revoking_refuses_the_key_from_the_next_request_and_is_audited(world: World) -> None:
    record, secret = await world.keys.create("api", KeyOrder(name="ci"), audit=world.draft())
    with pytest.raises(NotFound, match="^no node token"):
        await world.keys.revoke("node", record.id, audit=world.draft())  # an API key is not a node token
    with pytest.raises(NotFound, match="^no API key 'k_nope'"):
        await world.keys.revoke("api", "k_nope", audit=world.draft())
    assert world.access.keys.check(f"Bearer {secret}")

    await world.keys.revoke("api", record.id, audit=world.draft("DELETE /api/v1/keys/{id}"))
    with pytest.raises(Unauthorized, match="revoked"):
        world.access.keys.check(f"Bearer {secret}")
    assert world.store.get_key(record.id).revoked_at is not None
    assert world.rows()[-1][0] == f"key:{record.id}"
    assert [type(k).__name__ for k in await world.keys.listing("api")] == ["KeyRecord"]


# --- memberships -------------------------------------------------------------------------------------


async def test_leaving_a_place_revokes_the_keys_no_longer_reached_and_the_row_names_them(world: World) -> None:
    ada = await world.people.create(email="ada@example.com")
    await world.members.join(ada.id, "team:acme/ml", None, audit=world.draft("POST m"))
    await world.members.join(ada.id, world.ops, "manager", audit=world.draft("POST m"))
    chat_key, chat_secret = await world.keys.create(
        "api", KeyOrder(project="acme/ml/chat", user=ada.id), audit=world.draft()
    )
    _, ops_secret = await world.keys.create("api", KeyOrder(project="acme/ml/ops", user=ada.id), audit=world.draft())
    assert world.rows()[1] == (
        f"user:{ada.id}",
        {"target": f"project:{world.ops}", "path": "acme/ml/ops", "role": "manager"},
    )

    await world.members.leave("ADA@example.com", "team:acme/ml", audit=world.draft("DELETE m"))
    with pytest.raises(Unauthorized, match="revoked"):
        world.access.keys.check(f"Bearer {chat_secret}")
    assert world.access.keys.check(f"Bearer {ops_secret}")  # still a member of ops itself
    assert world.store.get_key(chat_key.id).revoked_at is not None
    assert [m.target for m in world.members.memberships(ada.id)] == [world.ops]
    assert world.rows()[-1][1]["revokes_keys_in"] == ["acme/ml/chat"]


@pytest.mark.parametrize(
    ("person", "target", "role", "error", "refusal"),
    [
        ("nobody@example.com", "team:acme/ml", None, NotFound, "^no person 'nobody@example.com'"),
        ("ada@example.com", "team:acme/ml", "owner", InvalidInput, "^role: 'owner' is not one of"),
        ("ada@example.com", None, None, InvalidInput, "^target: name where the person belongs"),
        ("ada@example.com", "team:acme/nope", None, NotFound, "^target: "),
        ("ada@example.com", "user:ada@example.com", None, InvalidInput, "^target: "),
    ],
)
async def test_a_membership_against_the_rules_is_refused(
    world: World, person: str, target: str | None, role: str | None, error: type[Exception], refusal: str
) -> None:
    ada = await world.people.create(email="ada@example.com")
    draft = world.draft("POST m")
    with pytest.raises(error, match=refusal):
        await world.members.join(person, target, role, audit=draft)
    assert world.people.memberships(ada.id) == [] and not draft.committed and world.rows() == []


async def test_leaving_a_place_one_is_not_in_is_not_found(world: World) -> None:
    await world.people.create(email="ada@example.com")
    with pytest.raises(NotFound, match="^target: ada@example.com is not a member of team:"):
        await world.members.leave("ada@example.com", "acme/ml", audit=world.draft("DELETE m"))
    with pytest.raises(InvalidInput, match="^state: 'gone' is not one of"):
        world.members.users("gone")


# --- sign-in secrets ---------------------------------------------------------------------------------


async def test_a_secret_is_kept_audited_without_its_value_and_turns_scim_on(world: World) -> None:
    assert not await world.secrets.scim_on()
    with pytest.raises(InvalidInput, match="^name: 'root' is not a secret opod keeps"):
        await world.secrets.put("root", "x", audit=world.draft())
    with pytest.raises(InvalidInput, match="^value: send the secret"):
        await world.secrets.put("scim-token", "", audit=world.draft())
    record = await world.secrets.put("scim-token", "tok-ab12cd34", audit=world.draft("PUT s"))
    assert record.name == "auth/scim-token" and record.updated_by == "alice"
    assert await world.secrets.scim_on() and await world.secrets.scim_token() == "tok-ab12cd34"
    assert world.rows()[-1] == ("secret:auth/scim-token", {"name": "scim-token", "reference": "store:auth/scim-token"})

    world.settings.apply(1, ClusterSettings.model_validate({"auth": {"scim_token": "store:auth/ldap-bind"}}))
    assert world.secrets.scim_secret_name() == "auth/ldap-bind" and not await world.secrets.scim_on()


# --- the tree ----------------------------------------------------------------------------------------


async def test_the_trees_changes_are_audited_by_path_and_refused_by_rule(world: World) -> None:
    acme = world.tenancy.resolve("org:acme").id
    team = await world.tenancy.create("team", "infra", acme, audit=world.draft("POST /api/v1/teams"))
    assert world.rows()[-1][0] == "team:acme/infra"  # named by path however the parent was named
    await world.tenancy.change("team", team.id, name="platform", parent=None, audit=world.draft("PATCH t"))
    assert world.rows()[-1] == (f"team:{team.id}", {"was": "team:acme/infra", "name": "platform"})
    await world.tenancy.delete("team", "acme/platform", audit=world.draft("DELETE t"))
    assert world.rows()[-1] == (f"team:{team.id}", {"path": "acme/platform"})

    for call, refusal in (
        (world.tenancy.create("team", "", "acme"), "^name: give the team a name"),
        (world.tenancy.create("org", "beta", "acme"), "^in: an organization is at the top of the tree; leave in out"),
        (world.tenancy.change("team", "acme/ml", name=None, parent=None), "^name or in: give a new name"),
        (world.tenancy.change("org", "acme", name=None, parent="x"), "^in: an organization .* cannot be moved"),
    ):
        with pytest.raises(InvalidInput, match=refusal):
            await call
    assert [o.name for o in world.tenancy.orgs] == ["acme"] and [t.name for t in world.tenancy.teams] == ["ml"]
