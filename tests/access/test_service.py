"""The access service: what it writes is in the store and in the key table at once, and survives a restart."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from opod.access.nodetokens import LOCAL_TOKEN_ID
from opod.access.service import AccessService, LocalTokenRevoked
from opod.http.errors import Unauthorized
from opod.security.nodetokens import NodeTokenMinter
from opod.store import Store

SECRET = secrets.token_bytes(32)


def open_service(home: Path) -> AccessService:
    return AccessService.load(Store.open(home=home), NodeTokenMinter(SECRET))


@pytest.fixture
def access(tmp_path: Path) -> Iterator[AccessService]:
    service = open_service(tmp_path)
    yield service
    service.store.close()


async def test_a_created_key_works_at_once_and_a_revoked_one_is_refused_at_once(access: AccessService) -> None:
    record, secret = await access.create("api", "ci")
    assert record.id.startswith("k_") and secret.startswith("sk-opod-")
    assert access.keys.check(f"Bearer {secret}").id == record.id
    assert (await access.get_key(record.id)).name == "ci"
    await access.revoke(record.id)
    with pytest.raises(Unauthorized, match="revoked"):
        access.keys.check(f"Bearer {secret}")
    assert (await access.get_key(record.id)).revoked_at is not None


async def test_a_node_token_is_derived_from_its_id_and_named_t(access: AccessService) -> None:
    record, token = await access.create("node", "rack 4")
    assert record.id.startswith("t_") and token.startswith(f"sk-node-{record.id}.")
    assert [r.id for r in await access.list_keys("node")] == [record.id]


async def test_keys_used_get_their_last_use_stored_in_one_flush(access: AccessService) -> None:
    used, secret = await access.create("api", "used")
    idle, _ = await access.create("api", "idle")
    access.keys.check(f"Bearer {secret}")
    access.keys.check(f"Bearer {secret}")
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert await access.flush_key_uses(at) == 1
    assert (await access.get_key(used.id)).last_used_at == at
    assert (await access.get_key(idle.id)).last_used_at is None
    assert await access.flush_key_uses() == 0, "nothing used since: nothing written"


async def test_a_failed_flush_keeps_the_uses_for_the_next(tmp_path: Path) -> None:
    first = open_service(tmp_path)
    record, secret = await first.create("api", "used")
    first.keys.check(f"Bearer {secret}")
    first.store.close()
    assert await first.flush_key_uses() == 0
    assert first.keys.take_used() == {record.id}


def test_the_admin_key_is_created_once_and_replaced_when_its_file_differs(tmp_path: Path) -> None:
    path = tmp_path / "admin.key"
    first = open_service(tmp_path / "db")
    created = first.ensure_admin_key(path, "host:/home/a")
    assert created is not None and path.read_text().strip() == created and path.stat().st_mode & 0o777 == 0o600
    assert first.ensure_admin_key(path, "host:/home/a") is None, "the file matches: nothing new to show"
    first.store.close()

    path.write_text("sk-orc-someone-edited-this\n")
    second = open_service(tmp_path / "db")
    replaced = second.ensure_admin_key(path, "host:/home/a")
    assert replaced is not None and replaced != created
    with pytest.raises(Unauthorized):
        second.keys.check(f"Bearer {created}", kinds=("admin",))
    assert second.keys.check(f"Bearer {replaced}", kinds=("admin",)).kind == "admin"
    second.store.close()


async def test_the_local_worker_token_is_stored_once_and_refused_once_revoked(access: AccessService) -> None:
    token = access.local_worker_token()
    assert access.local_worker_token() == token
    await access.revoke(LOCAL_TOKEN_ID)
    with pytest.raises(LocalTokenRevoked, match="opod up --no-worker"):
        access.local_worker_token()


async def test_what_was_written_is_read_back_after_a_restart(tmp_path: Path) -> None:
    first = open_service(tmp_path)
    kept, secret = await first.create("api", "kept")
    gone, gone_secret = await first.create("api", "gone")
    await first.revoke(gone.id)
    assert first.add_tombstones({"k_cp_bob"}).persisted
    first.store.close()

    restarted = open_service(tmp_path)
    assert restarted.keys.check(f"Bearer {secret}").id == kept.id
    with pytest.raises(Unauthorized, match="revoked"):
        restarted.keys.check(f"Bearer {gone_secret}")
    assert restarted.keys.tombstones == {"k_cp_bob"}
    restarted.store.close()
