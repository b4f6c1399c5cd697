"""The auth file applied to the gateway's keys, checked over real HTTP through the real gateway."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import certifi
import httpx
import pytest

from opod.access.service import TOMBSTONES_META_KEY, AccessService
from opod.contract.wire import format_time
from opod.snapshots.auth import AuthFile
from opod.snapshots.service import SnapshotPaths, Snapshots
from opod.snapshots.watch import FileWatcher
from tests.snapshots.helpers import (
    Events,
    eventually,
    gateway_app,
    open_access,
    serving,
    write_atomic,
)

ALICE = "sk-orc-alice-secret"
BOB = "sk-orc-bob-secret"


def key(id_: str, plaintext: str, **extra: object) -> dict:
    return {"id": id_, "name": id_.title(), "hash": hashlib.sha256(plaintext.encode()).hexdigest(), **extra}


def auth(revision: str, *keys: dict, **extra: object) -> dict:
    return {"revision": revision, "requireKeys": True, "keys": list(keys), **extra}


def now_text(delta: float = 0) -> str:
    return format_time(datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=delta))


async def status(client: httpx.AsyncClient, secret: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    resp = await client.get("/v1/models", headers=headers)
    return resp.status_code, resp.text


@pytest.fixture
def auth_path(tmp_path: Path) -> Path:
    return tmp_path / "auth.json"


async def test_a_key_added_works_and_a_revoked_one_is_refused_within_2_s(
    auth_path: Path, access: AccessService
) -> None:
    keys, events = access.keys, Events()
    snaps = Snapshots(access, events, paths=SnapshotPaths(auth=auth_path))
    await snaps.start()
    try:
        with gateway_app(access, auth_path.parent, snapshots=snaps) as app:
            await _revoked_within_2_s(app, snaps, auth_path)
    finally:
        await snaps.stop()
    updated = events.of("auth.updated")
    assert [e["revision"] for e in updated] == ["r1", "r2", "r3"]
    assert updated[1]["new_revoked_keys"] == ["k_cp_alice"] and updated[2]["refused_rows"] == ["k_cp_alice"]
    assert access.store.get_meta(TOMBSTONES_META_KEY) == '["k_cp_alice"]'
    assert keys.check(f"Bearer {BOB}").id == "k_cp_bob"


async def _revoked_within_2_s(app: object, snaps: Snapshots, auth_path: Path) -> None:
    keys = snaps.access.keys
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await status(client, ALICE))[0] == 401
        write_atomic(auth_path, auth("r1", key("alice", ALICE), key("bob", BOB)))

        async def alice_in() -> bool:
            return (await status(client, ALICE))[0] == 200

        assert await eventually(alice_in) < 2.0
        assert keys.check(f"Bearer {ALICE}").id == "k_cp_alice"  # usage rows name it so
        write_atomic(auth_path, auth("r2", key("alice", ALICE), key("bob", BOB), revokedKeys=["alice"]))

        async def alice_out() -> bool:
            return (await status(client, ALICE))[0] == 401

        assert await eventually(alice_out) < 2.0
        assert "revoked by the manager" in (await status(client, ALICE))[1]
        assert (await status(client, BOB))[0] == 200
        # A later file that omits the tombstone, or lists the key again, does not lift it.
        write_atomic(auth_path, auth("r3", key("alice", ALICE), key("bob", BOB)))
        await eventually(lambda: snaps.auth.revision == "r3")
        assert (await status(client, ALICE))[0] == 401
        assert (await status(client, BOB))[0] == 200


def test_tombstones_survive_a_restart_of_the_leader(auth_path: Path, tmp_path: Path) -> None:
    write_atomic(auth_path, auth("r1", key("alice", ALICE), revokedKeys=["bob"]))
    first = open_access(tmp_path / "home")
    FileWatcher(auth_path, AuthFile(first)).poll()
    assert first.keys.tombstones == {"k_cp_bob"}
    first.store.close()

    # The leader restarts; the manager's next file lists bob as a key again and forgets the tombstone.
    write_atomic(auth_path, auth("r2", key("alice", ALICE), key("bob", BOB)))
    restarted = open_access(tmp_path / "home")
    second = restarted.keys
    assert second.tombstones == {"k_cp_bob"}  # before any file is read
    FileWatcher(auth_path, AuthFile(restarted)).poll()
    assert second.check(f"Bearer {ALICE}").id == "k_cp_alice"
    with pytest.raises(Exception, match="revoked by the manager"):
        second.check(f"Bearer {BOB}")


async def test_a_key_removed_from_the_file_stops_working_and_local_keys_are_never_touched(
    auth_path: Path, access: AccessService
) -> None:
    keys = access.keys
    record, local = await access.create("api", "mine")
    watcher = FileWatcher(auth_path, AuthFile(access))
    write_atomic(auth_path, auth("r1", key("alice", ALICE), key("bob", BOB), revokedKeys=[record.id]))
    watcher.poll()
    assert keys.check(f"Bearer {BOB}").source == "snapshot"
    write_atomic(auth_path, auth("r2", key("alice", ALICE)))
    watcher.poll()
    with pytest.raises(Exception, match="not known here"):
        keys.check(f"Bearer {BOB}")
    assert keys.check(f"Bearer {local}").id == record.id  # a file tombstone names file keys only


async def test_a_malformed_file_keeps_the_last_good_and_names_the_field(auth_path: Path, access: AccessService) -> None:
    keys, events = access.keys, Events()
    watcher = FileWatcher(auth_path, AuthFile(access), events)
    write_atomic(auth_path, auth("r1", key("alice", ALICE)))
    watcher.poll()
    cases = [
        (auth("r2", {"id": "bob", "name": "Bob", "hash": "not-a-hash"}), "keys[0].hash (id 'bob')"),
        (auth("r2", {"id": 7, "hash": "x"}), "keys.0.id: expected a string"),
        (auth("r2", key("a", ALICE), key("a", BOB)), "keys[1].id: 'a' is also keys[0].id"),
        (auth("r2", key("a", ALICE), key("b", ALICE)), "keys[1].hash (id 'b'): the same hash as key 'a'"),
        (auth("r2", key("a", ALICE, expiresAt="tomorrow")), "keys[0].expiresAt (id 'a')"),
        (auth("r2", issuedAt="2026-13-01"), "issuedAt"),
        (auth("r2", revokedKeys=[""]), "revokedKeys[0]"),
        ({"revision": "r2", "requireKeys": "yes"}, "requireKeys: expected true or false"),
    ]
    for content, field in cases:
        write_atomic(auth_path, content)
        assert watcher.poll() == "rejected", content
        reason = events.of("auth.rejected")[-1]["reason"]
        assert field in reason, (field, reason)
        assert events.of("auth.rejected")[-1]["kept_revision"] == "r1"
        assert keys.check(f"Bearer {ALICE}").id == "k_cp_alice"


async def test_require_keys_comes_from_the_file_else_the_leaders_setting(
    auth_path: Path, access: AccessService, tmp_path: Path
) -> None:
    keys = access.keys
    watcher = FileWatcher(auth_path, AuthFile(access))
    with gateway_app(access, tmp_path / "closed", require_keys=True) as app:
        await _require_keys_follows_the_file(app, watcher, auth_path)
    open_access_ = open_access(tmp_path / "open")
    try:
        with gateway_app(open_access_, tmp_path / "open", require_keys=False) as app:
            async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
                assert (await status(client, None))[0] == 200
    finally:
        open_access_.store.close()
    assert keys.require_keys(default=False) is True  # the last file said so


async def _require_keys_follows_the_file(app: object, watcher: FileWatcher, auth_path: Path) -> None:
    holder = watcher.applier
    assert isinstance(holder, AuthFile)
    keys = holder.access.keys
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await status(client, None))[0] == 401  # no file: the leader's own setting
        write_atomic(auth_path, {"revision": "open", "requireKeys": False, "keys": [key("alice", ALICE)]})
        watcher.poll()
        assert (await status(client, None))[0] == 200  # anonymous allowed
        assert (await status(client, "sk-whatever"))[0] == 200  # an unknown key is served anonymously
        assert keys.authenticate(f"Bearer {ALICE}", True).id == "k_cp_alice"  # a good key still names the caller
        write_atomic(auth_path, {"revision": "closed", "requireKeys": True, "keys": [key("alice", ALICE)]})
        watcher.poll()
        assert (await status(client, None))[0] == 401
        assert (await status(client, ALICE))[0] == 200


async def test_a_stale_snapshot_refuses_keyed_traffic_naming_both_numbers(
    tmp_path: Path, access: AccessService
) -> None:
    auth_path, policy_path = tmp_path / "auth.json", tmp_path / "policy.json"
    events = Events()
    _, local = await access.create("api", "mine")
    write_atomic(policy_path, {"revision": "p1", "auth": {"maxSnapshotAgeSec": 60}})
    write_atomic(auth_path, auth("r1", key("alice", ALICE), issuedAt=now_text(-125)))
    snaps = Snapshots(access, events, paths=SnapshotPaths(auth=auth_path, policy=policy_path))
    await snaps.start()
    try:
        with gateway_app(access, tmp_path, snapshots=snaps) as app:
            await _stale_then_fresh(app, snaps, auth_path, policy_path, local)
    finally:
        await snaps.stop()


async def _stale_then_fresh(app: object, snaps: Snapshots, auth_path: Path, policy_path: Path, local: str) -> None:
    keys = snaps.access.keys
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
        resp = await client.get("/v1/models", headers={"Authorization": f"Bearer {ALICE}"})
        assert resp.status_code == 503 and resp.headers["Retry-After"]
        error = resp.json()["error"]
        assert error["code"] == "auth_snapshot_stale"
        assert "issued 12" in error["message"] and "maxSnapshotAgeSec of 60 s" in error["message"]
        assert "revision 'r1'" in error["message"] and "fresh auth file" in error["message"]
        assert (await status(client, local))[0] == 200  # a local key does not depend on the manager
        assert 120 <= snaps.status()["auth_snapshot_age_sec"] <= 130
        # The manager re-issues: served again within 2 s.
        write_atomic(auth_path, auth("r2", key("alice", ALICE), issuedAt=now_text()))

        async def served() -> bool:
            return (await status(client, ALICE))[0] == 200

        assert await eventually(served) < 2.0
        # Age bound lifted (0 = fail-static): an old snapshot serves.
        write_atomic(auth_path, auth("r3", key("alice", ALICE), issuedAt=now_text(-10_000)))
        await eventually(lambda: snaps.auth.revision == "r3")
        assert (await status(client, ALICE))[0] == 503
        write_atomic(policy_path, {"revision": "p2"})
        await eventually(lambda: keys.max_snapshot_age_sec == 0)
        assert (await status(client, ALICE))[0] == 200


def test_an_expired_key_is_refused(auth_path: Path, access: AccessService) -> None:
    keys = access.keys
    write_atomic(
        auth_path, auth("r1", key("alice", ALICE, expiresAt=now_text(-1)), key("bob", BOB, expiresAt=now_text(3600)))
    )
    FileWatcher(auth_path, AuthFile(access)).poll()
    with pytest.raises(Exception, match="expired"):
        keys.check(f"Bearer {ALICE}")
    assert keys.check(f"Bearer {BOB}").expires_at is not None


def test_class_team_and_scope_travel_with_the_key(auth_path: Path, access: AccessService) -> None:
    keys = access.keys
    write_atomic(auth_path, auth("r1", key("alice", ALICE, **{"class": "critical", "team": "search", "scope": "chat"})))
    FileWatcher(auth_path, AuthFile(access)).poll()
    entry = keys.check(f"Bearer {ALICE}")
    assert (entry.admission_class, entry.team, entry.scope, entry.name) == ("critical", "search", "chat", "Alice")


def first_ca() -> str:
    text = Path(certifi.where()).read_text()
    start = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    return text[start:end] + "\n"


def test_node_mtls_is_held_honestly_and_require_is_refused_without_a_tls_listener(
    auth_path: Path, access: AccessService
) -> None:
    events = Events()
    holder = AuthFile(access)
    watcher = FileWatcher(auth_path, holder, events)
    ca = first_ca()
    write_atomic(auth_path, auth("r1", key("alice", ALICE), nodeMtls="allow", nodeCertCa=ca, revokedCerts=["0a1b2c"]))
    assert watcher.poll() == "updated"
    mtls = holder.node_mtls
    assert mtls.mode == "allow" and not mtls.enforced and mtls.is_revoked(0x0A1B2C) and mtls.is_revoked("0A:1B:2C")
    assert "not enforced" in events.of("auth.updated")[-1]["node_mtls"]

    for extra, field in [
        ({"nodeMtls": "require", "nodeCertCa": ca}, "nodeMtls: 'require' cannot be honoured"),
        ({"nodeMtls": "allow"}, "nodeMtls: 'allow' needs nodeCertCa"),
        (
            {"nodeMtls": "allow", "nodeCertCa": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
            "nodeCertCa: the PEM does not load",
        ),
        ({"nodeCertCa": "hello"}, "nodeCertCa: not PEM"),
        ({"revokedCerts": ["0A:1B"]}, "revokedCerts[0]"),
        ({"nodeMtls": "sometimes"}, "nodeMtls: 'sometimes' is not one of"),
    ]:
        write_atomic(auth_path, auth("r2", key("alice", ALICE), **extra))
        assert watcher.poll() == "rejected"
        assert field in events.of("auth.rejected")[-1]["reason"]
    assert holder.node_mtls == mtls and holder.revision == "r1"

    # On a leader whose join listener checks client certificates, require is accepted.
    verified = AuthFile(access, client_certs_verified=True)
    write_atomic(auth_path, auth("r3", nodeMtls="require", nodeCertCa=ca))
    FileWatcher(auth_path, verified).poll()
    assert verified.node_mtls.mode == "require" and verified.node_mtls.enforced


def test_tombstones_apply_even_when_storing_them_fails(auth_path: Path, access: AccessService) -> None:
    keys, events = access.keys, Events()
    access.store.close()  # every write now fails, as with a store gone away
    write_atomic(auth_path, auth("r1", key("alice", ALICE), revokedKeys=["alice"]))
    FileWatcher(auth_path, AuthFile(access), events).poll()
    with pytest.raises(Exception, match="revoked"):
        keys.check(f"Bearer {ALICE}")
    assert "could not be saved" in events.of("auth.updated")[0]["warning"]
