"""The settings' one writer, without HTTP: a version to the store with its audit row, then in force in the holder.

Each change is checked in the store, in memory (the holder and its subscribers) and in the audit; each refusal
leaves all three as they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.access.scopes import check_scope
from opod.settings.holder import SettingsHolder
from opod.settings.schema import ClusterSettings
from opod.settings.service import SettingsService
from opod.store import Conflict, InvalidInput, NotFound, Store
from opod.store.audit import AuditDraft

BODY_1 = "retention: {requests_days: 3}\n"
BODY_2 = "retention: {requests_days: 9}\nwebhooks:\n  - url: https://hooks.example.com/x\n    secret: hunter2-hook\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(None, home=tmp_path) as opened:
        yield opened


class World:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.holder = SettingsHolder(store)
        self.holder.load()
        self.seen: list[ClusterSettings] = []
        self.holder.subscribe(self.seen.append)
        self.service = SettingsService(store, self.holder, check_scope)

    def draft(self, actor: str = "alice", action: str = "PUT /api/v1/settings") -> AuditDraft:
        return AuditDraft(actor=actor, source="api", action=action)

    def rows(self) -> list[dict[str, object]]:
        return [
            {"actor": r.actor, "target": r.target, "detail": r.detail, "status": r.status}
            for r in reversed(self.store.list_audit())
        ]


@pytest.fixture
def world(store: Store) -> World:
    return World(store)


async def test_a_put_is_stored_with_its_audit_row_then_in_force_and_told_to_subscribers(world: World) -> None:
    draft = world.draft()
    record = await world.service.put(0, BODY_1, note="shorter", audit=draft)

    assert (record.version, record.body, record.note, record.by) == (1, BODY_1, "shorter", "alice")
    assert world.store.settings_newest() == 1 and world.store.settings_version(1) == record
    assert world.holder.version == 1 and world.holder.current.retention.requests_days == 3
    assert world.seen == [world.holder.current]
    assert draft.committed
    assert world.rows() == [
        {"actor": "alice", "target": "settings:v1", "detail": '{"base":0,"note":"shorter"}', "status": 200}
    ]

    await world.service.put(1, BODY_2, note=None, audit=world.draft("bob"))
    assert world.holder.version == 2 and world.holder.current.retention.requests_days == 9
    assert "hunter2" not in json.dumps(world.rows())  # the body, which may name secrets, is in no row


async def test_a_stale_base_is_a_conflict_naming_the_newest_and_changes_nothing(world: World) -> None:
    await world.service.put(0, BODY_1, note=None, audit=world.draft())
    await world.service.put(1, BODY_2, note=None, audit=world.draft())
    before, rows = world.holder.current, world.rows()

    draft = world.draft("carol")
    with pytest.raises(Conflict, match=r"^base: base 1 is not the newest settings version: version 2 is"):
        await world.service.put(1, BODY_1, note="mine", audit=draft)
    assert world.store.settings_newest() == 2
    assert world.holder.version == 2 and world.holder.current is before and len(world.seen) == 2
    assert not draft.committed and world.rows() == rows  # the listener records the refusal with its 409
    assert draft.body == {"base": 1, "note": "mine"}  # what that row will hold: never the body


@pytest.mark.parametrize(
    ("base", "body", "refusal"),
    [
        (0, None, r"^body: missing"),
        (0, "retention: {requests_days: -1}\nprices: {}\n", r"^body: .*line 1: retention\.requests_days"),
        (
            0,
            "budgets:\n  - scope: team:acme\n    micros: 5\n",
            r"line 2: budgets\[0\]\.scope: 'team:acme' is not a team",
        ),
        (0, "[1, 2]", r"must be a mapping"),
        (-1, BODY_1, r"^base: -1 is not a version"),
        (2**63 - 1, "", r"^base: "),
        (None, "", r"^body: empty, which puts every setting back to its default; to mean that, send it with base"),
        (None, "  \n\t\n", r"^body: empty"),
    ],
)
async def test_a_refused_put_changes_neither_the_store_nor_what_is_in_force(
    world: World, base: int | None, body: str | None, refusal: str
) -> None:
    draft = world.draft()
    with pytest.raises(InvalidInput, match=refusal):
        await world.service.put(base, body, note=None, audit=draft)
    assert world.store.settings_newest() == 0 and world.holder.version == 0 and world.seen == []
    assert not draft.committed and world.rows() == []


async def test_an_empty_body_with_its_base_puts_every_default_back(world: World) -> None:
    await world.service.put(None, BODY_2, note=None, audit=world.draft())  # no base on a fresh cluster: 0
    assert world.holder.current.retention.requests_days == 9

    record = await world.service.put(1, "", note="back to defaults", audit=world.draft())
    assert (record.version, record.body) == (2, "")
    assert world.holder.version == 2 and world.holder.current == ClusterSettings()


async def test_a_rollback_writes_the_old_body_as_the_newest_version(world: World) -> None:
    await world.service.put(0, BODY_1, note=None, audit=world.draft())
    await world.service.put(1, BODY_2, note=None, audit=world.draft())

    draft = world.draft("dave", "POST /api/v1/settings/rollback")
    record = await world.service.rollback(1, note=None, audit=draft)
    assert (record.version, record.body, record.note, record.by) == (3, BODY_1, "rollback to version 1", "dave")
    assert [r.version for r in await world.service.history(10)] == [3, 2, 1]
    assert world.holder.version == 3 and world.holder.current.retention.requests_days == 3
    assert world.rows()[-1] == {
        "actor": "dave",
        "target": "settings:v3",
        "detail": '{"note":"rollback to version 1","rollback_to":1}',
        "status": 200,
    }


@pytest.mark.parametrize(("version", "error", "refusal"), [(None, InvalidInput, "^version: send"), (9, NotFound, "9")])
async def test_a_rollback_to_no_version_is_refused(
    world: World, version: int | None, error: type[Exception], refusal: str
) -> None:
    await world.service.put(0, BODY_1, note=None, audit=world.draft())
    draft = world.draft()
    with pytest.raises(error, match=refusal):
        await world.service.rollback(version, note=None, audit=draft)
    assert world.store.settings_newest() == 1 and world.holder.version == 1 and not draft.committed


async def test_the_reads_say_what_is_stored_and_what_is_in_force_here(store: Store) -> None:
    holder = SettingsHolder(store, local={"prometheus.url": "http://127.0.0.1:9090"})
    service = SettingsService(store, holder, check_scope)
    assert (service.in_force, await service.version(None), service.local_keys) == (0, None, ["prometheus.url"])
    store.put_settings(0, BODY_1, by="elsewhere")  # another leader's change: in force here once the holder polls
    assert (await service.version(None)) == store.settings_version(1) and service.in_force == 0
    with pytest.raises(NotFound):
        await service.version(5)
