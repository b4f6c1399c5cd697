"""Guard attachments through their one writer, on a real store, tenancy tree, people and keys: the store and its audit
row first, then the table the gateway reads; a refusal changes neither; another leader's changes are followed, and a
read that overlapped a change made here is not applied."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from opod.access.guard_attachments import Attachment
from opod.access.guard_service import GuardService, load_guard_attachments
from opod.access.keys import KeyService
from opod.access.people import People
from opod.access.service import AccessService
from opod.access.tenancy import Tenancy
from opod.security.nodetokens import NodeTokenMinter
from opod.settings.holder import SettingsHolder
from opod.settings.text import parse_settings
from opod.store import InvalidInput, NotFound, Store
from opod.store.audit import SOURCE_API, AuditDraft
from opod.store.following import StaleRead

SECRET = secrets.token_bytes(32)
SETTINGS = (
    "guard:\n"
    "  policies:\n"
    "    - name: pii\n"
    "      checks: [{pii: email, action: redact}]\n"
    "    - name: secrets\n"
    "      checks: [{pattern: 'sk-[a-z]+', name: api-key}]\n"
)


@dataclass
class Leader:
    """What a leader builds for the guard service, over one store."""

    store: Store
    access: AccessService
    people: People
    tenancy: Tenancy
    guard: GuardService

    @classmethod
    def open(cls, store: Store) -> Leader:
        access = AccessService.load(store, NodeTokenMinter(SECRET))
        people = People.load(store, access)
        tenancy = Tenancy.load(store, people)
        settings = SettingsHolder()
        settings.apply(1, parse_settings(SETTINGS))
        guard = GuardService(
            store,
            load_guard_attachments(store),
            tenancy=tenancy,
            keys=KeyService(access, tenancy, settings),
            settings=settings,
        )
        return cls(store, access, people, tenancy, guard)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    url = f"sqlite:///{tmp_path / 'opod.db'}"
    with Store.open(url) as first, Store.open(url) as second:
        yield first, second


@pytest.fixture
def leader(stores: tuple[Store, Store]) -> Leader:
    return Leader.open(stores[0])


def draft(action: str = "POST /api/v1/guard/attachments") -> AuditDraft:
    return AuditDraft(actor="ops@example.com", source=SOURCE_API, action=action, body={"sent": True})


async def chat(leader: Leader) -> str:
    """The ID of project acme/ml/chat, made with its team and organization."""
    await leader.tenancy.create("org", "acme", None)
    await leader.tenancy.create("team", "ml", "acme")
    return (await leader.tenancy.create("project", "chat", "acme/ml")).id


async def test_an_attachment_by_path_is_kept_by_id_with_its_row_then_read_by_the_gateway(leader: Leader) -> None:
    project = await chat(leader)
    audit = draft()
    made = await leader.guard.attach("project:acme/ml/chat", "pii", audit)
    assert made == Attachment("project", project, "pii") and audit.committed
    assert leader.guard.table.policies_for(project=project) == ("pii",)
    [stored] = leader.store.list_guard_attachments()
    assert (stored.scope, stored.scope_id, stored.policy, stored.created_by) == (
        "project",
        project,
        "pii",
        "ops@example.com",
    )
    [row] = leader.store.list_audit(limit=10)
    assert (row.action, row.target, row.status) == ("POST /api/v1/guard/attachments", f"project:{project}", 200)
    assert row.detail == '{"policy":"pii","target":"project:acme/ml/chat"}'


async def test_each_kind_of_target_is_named_as_people_know_it(leader: Leader) -> None:
    project = await chat(leader)
    ada = await leader.people.create(email="ada@example.com", name="Ada")
    key, _ = await leader.access.create("api", "ada's notebook", user_id=ada.id)
    for target in ("org:acme", "team:acme/ml", f"project:{project}", "user:ada@example.com", f"key:{key.id}"):
        await leader.guard.attach(target, "secrets", draft())
    assert [(s.attachment.scope, s.name) for s in leader.guard.standings()] == [
        ("org", "acme"),
        ("team", "acme/ml"),
        ("project", "acme/ml/chat"),
        ("user", "ada@example.com"),
        ("key", "ada's notebook"),
    ]


async def test_attaching_again_answers_the_same_attachment_and_changes_nothing(leader: Leader) -> None:
    await chat(leader)
    first = await leader.guard.attach("org:acme", "pii", draft())
    version = leader.guard.table.version
    assert await leader.guard.attach("org:acme", "pii", draft()) == first
    assert leader.guard.table.version == version and len(leader.store.list_guard_attachments()) == 1


@pytest.mark.parametrize(
    ("target", "policy", "refusal", "message"),
    [
        (
            "org:acme",
            "nope",
            InvalidInput,
            r"policy: 'nope' is not a policy of the settings' guard.policies \(pii, secrets\)",
        ),
        ("org:acme", None, InvalidInput, "policy: give the name of a policy"),
        ("node:n1", "pii", InvalidInput, "target: 'node:n1' starts with 'node', which is not a kind of scope"),
        (None, "pii", InvalidInput, "target: give a scope"),
        ("team:acme/nope", "pii", NotFound, "target: no team 'team:acme/nope'"),
        ("user:nobody@example.com", "pii", NotFound, "target: no person"),
        ("key:k_nope", "pii", NotFound, "target: no API key 'k_nope'"),
    ],
)
async def test_a_refused_attachment_changes_nothing_and_leaves_its_row_to_the_listener(
    leader: Leader, target: str | None, policy: str | None, refusal: type[Exception], message: str
) -> None:
    await chat(leader)
    audit = draft()
    with pytest.raises(refusal, match=message):
        await leader.guard.attach(target, policy, audit)
    assert not audit.committed and leader.guard.table.all() == ()
    assert leader.store.list_guard_attachments() == [] and leader.store.list_audit(limit=10) == []


async def test_a_detach_takes_it_off_and_one_not_attached_is_not_found(leader: Leader) -> None:
    project = await chat(leader)
    await leader.guard.attach("project:acme/ml/chat", "pii", draft())
    audit = draft("DELETE /api/v1/guard/attachments")
    removed = await leader.guard.detach(f"project:{project}", "pii", audit)
    assert removed == Attachment("project", project, "pii") and audit.committed
    assert leader.guard.table.all() == () and leader.store.list_guard_attachments() == []
    again = draft("DELETE /api/v1/guard/attachments")
    with pytest.raises(NotFound, match="policy 'pii' is not attached to 'project:acme/ml/chat'"):
        await leader.guard.detach("project:acme/ml/chat", "pii", again)
    assert not again.committed


async def test_a_policy_gone_from_the_settings_is_still_listed_and_can_be_detached(leader: Leader) -> None:
    await chat(leader)
    await leader.guard.attach("org:acme", "secrets", draft())
    leader.guard.settings.apply(2, parse_settings("guard: {policies: [{name: pii}]}"))
    assert [s.attachment.policy for s in leader.guard.standings()] == ["secrets"]
    assert (await leader.guard.detach("org:acme", "secrets", draft("DELETE"))).policy == "secrets"


async def test_attachments_made_on_one_leader_reach_the_others_table(stores: tuple[Store, Store]) -> None:
    one, two = Leader.open(stores[0]), Leader.open(stores[1])
    await chat(one)
    await two.tenancy.follow()
    await one.guard.attach("team:acme/ml", "pii", draft())
    assert two.guard.table.all() == ()
    assert await two.guard.follow() is True
    assert [s.name for s in two.guard.standings()] == ["acme/ml"]
    assert await two.guard.follow() is False
    await one.guard.detach("team:acme/ml", "pii", draft("DELETE"))
    assert await two.guard.follow() is True and two.guard.table.all() == ()
    assert load_guard_attachments(stores[1]).all() == ()  # and a restart reads the same


async def test_a_read_that_overlapped_a_change_here_is_not_applied(stores: tuple[Store, Store]) -> None:
    leader = Leader.open(stores[0])
    await chat(leader)
    started, released = threading.Event(), threading.Event()

    class SlowRead:
        """The store, whose read of the attachments is held until the change below has been made here."""

        def __getattr__(self, name: str) -> object:
            return getattr(stores[0], name)

        def list_guard_attachments(self) -> list:
            rows = stores[0].list_guard_attachments()
            started.set()
            released.wait(5)
            return rows

    follower = GuardService(
        SlowRead(),  # type: ignore[arg-type]
        leader.guard.table,
        tenancy=leader.tenancy,
        keys=leader.guard.keys,
        settings=leader.guard.settings,
    )
    reading = asyncio.ensure_future(follower.follow())
    assert await asyncio.to_thread(started.wait, 5)
    await leader.guard.attach("org:acme", "pii", draft())
    released.set()
    with pytest.raises(StaleRead):
        await reading
    assert leader.guard.table.policies_for(org=leader.tenancy.resolve("org:acme").id) == ("pii",)
    assert await follower.follow() is False
