"""Two leaders on one store agree within 2 s: keys minted or revoked, the tenancy tree, quotas, admin keys.

Several leaders share one store and every one serves ``/v1``; each keeps keys and the tree in
memory, so what one leader changes reaches the other's memory by its following of the store.
Both here are ``opod up --no-worker`` processes with their own homes on one SQLite file.
``GET /v1/models`` needs a key but no engine, so it shows a key accepted or refused. Each leader keeps
its own admin key, and every active admin key opens every leader's ``/api/v1``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from bench.ports import free_port
from tests.support.opod_process import Leader, OpodProcess, clean_env, http, wait_until

WITHIN = 2.0
EXTRA = ["--no-default-models"]


@pytest.fixture(scope="module")
def store_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One store, and the one key that seals its secrets, named to both leaders (each made one of its own otherwise)."""
    shared = tmp_path_factory.mktemp("store")
    key = shared / "secrets.key"
    key.write_bytes(Fernet.generate_key())
    key.chmod(0o600)
    return {"OPOD_DATABASE_URL": f"sqlite:///{shared / 'opod.db'}", "OPOD_SECRETS_KEY_FILE": str(key)}


@pytest.fixture(scope="module")
def leaders(tmp_path_factory: pytest.TempPathFactory, store_env: dict[str, str]) -> Iterator[tuple[Leader, Leader]]:
    env = store_env
    first = Leader(tmp_path_factory.mktemp("a") / "home", worker=False, extra=EXTRA, env=env)
    try:
        second = Leader(tmp_path_factory.mktemp("b") / "home", worker=False, extra=EXTRA, env=env)
        try:
            yield first, second
        finally:
            second.process.stop()
    finally:
        first.process.stop()


@pytest.fixture(scope="module")
def tree(leaders: tuple[Leader, Leader]) -> float:
    """acme/ml/chat, made on the first leader; the moment it was answered."""
    a, _ = leaders
    for path, body in (
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
    ):
        status, answer = a.admin("POST", path, body)
        assert status == 201, answer
    return time.monotonic()


def models_status(leader: Leader, secret: str) -> int:
    return http("GET", leader.url + "/v1/models", key=secret)[0]


def soon(predicate, what: str, since: float) -> None:
    """``predicate`` holds within :data:`WITHIN` seconds of ``since`` (when the change was answered)."""
    wait_until(predicate, WITHIN + 0.5, what, interval=0.05)
    assert time.monotonic() - since < WITHIN, f"{what} took {time.monotonic() - since:.2f} s"


def test_a_key_made_on_one_leader_works_on_the_other_and_its_revocation_is_refused_there(
    leaders: tuple[Leader, Leader],
) -> None:
    a, b = leaders
    status, created = a.admin("POST", "/api/v1/keys", {"name": "bot"})
    assert status == 201, created
    made = time.monotonic()
    assert models_status(a, created["secret"]) == 200
    soon(lambda: models_status(b, created["secret"]) == 200, "the new key accepted on the other leader", made)

    status, answer = a.admin("DELETE", f"/api/v1/keys/{created['id']}")
    assert status == 200, answer
    revoked = time.monotonic()
    assert models_status(a, created["secret"]) == 401
    soon(lambda: models_status(b, created["secret"]) == 401, "the revoked key refused on the other leader", revoked)
    status, _, body = http("GET", b.url + "/v1/models", key=created["secret"])
    assert "revoked" in str(body)


def test_a_project_made_on_one_leader_takes_keys_on_the_other(leaders: tuple[Leader, Leader], tree: float) -> None:
    a, b = leaders
    made = tree

    def key_on_b() -> dict | None:
        status, answer = b.admin("POST", "/api/v1/keys", {"name": "chat bot", "project": "acme/ml/chat"})
        assert status in (201, 404), answer  # 404 naming the project until the tree is in force there
        return answer if status == 201 else None

    created = wait_until(key_on_b, WITHIN + 0.5, "the project known to the other leader", interval=0.05)
    assert time.monotonic() - made < WITHIN
    soon(lambda: models_status(a, created["secret"]) == 200, "B's key accepted on A", time.monotonic())
    status, orgs = b.admin("GET", "/api/v1/orgs")
    assert status == 200 and "acme" in str(orgs)
    # The key made on B, for A's project, is listed and usable on A too.
    status, listed = a.admin("GET", "/api/v1/keys?project=acme/ml/chat")
    assert status == 200 and isinstance(listed, list) and [k["name"] for k in listed] == ["chat bot"]


def test_a_quota_put_on_one_leader_is_listed_by_the_other(leaders: tuple[Leader, Leader], tree: float) -> None:
    a, b = leaders
    status, answer = a.admin("PUT", "/api/v1/quotas", {"scope": "team:acme/ml", "limit": {"gpus": 2}})
    assert status == 200, answer
    put = time.monotonic()

    def listed_on_b() -> bool:
        status, quotas = b.admin("GET", "/api/v1/quotas")
        assert status == 200 and isinstance(quotas, list), quotas
        return any(q["scope"] == answer["scope"] and q.get("limit", {}).get("gpus") == 2 for q in quotas)

    soon(listed_on_b, "the quota listed by the other leader", put)
    status, gone = a.admin("DELETE", f"/api/v1/quotas/{answer['scope']}")
    assert status == 200, gone
    removed = time.monotonic()
    soon(lambda: not listed_on_b(), "the removed quota gone from the other leader", removed)


def opens_admin_api(leader: Leader, secret: str) -> bool:
    status, _, body = http("GET", leader.admin_url + "/api/v1/keys", key=secret)
    assert status in (200, 401), body
    return status == 200


def restart(leader: Leader, env: dict[str, str]) -> None:
    """Stop ``leader`` and start it again on the same home and addresses; the object then stands for the new process."""
    leader.process.stop()
    again = Leader(leader.home, worker=False, extra=EXTRA, env=env, ports=(leader.port, leader.admin_port))
    leader.process, leader.key = again.process, again.key


def test_each_leader_keeps_its_admin_key_and_every_admin_key_opens_both(
    leaders: tuple[Leader, Leader], store_env: dict[str, str]
) -> None:
    a, b = leaders
    assert a.key != b.key
    for leader in (a, b):
        assert opens_admin_api(leader, a.key) and opens_admin_api(leader, b.key), "B's start revoked no key of A's"

    first_a = a.key
    restart(a, store_env)  # admin.key kept: the same key, and B's untouched
    assert a.key == first_a
    for leader in (a, b):
        assert opens_admin_api(leader, a.key) and opens_admin_api(leader, b.key), "A's restart revoked no key of B's"

    (a.home / "admin.key").unlink()  # A's key handed out no more: A's next start mints another and revokes its own
    restart(a, store_env)
    started = time.monotonic()
    assert a.key != first_a and "admin key" in a.process.output
    assert opens_admin_api(a, a.key) and opens_admin_api(a, b.key) and not opens_admin_api(a, first_a)
    assert opens_admin_api(b, b.key)
    soon(lambda: opens_admin_api(b, a.key), "A's new admin key accepted on B", started)
    soon(lambda: not opens_admin_api(b, first_a), "A's old admin key refused on B", started)


def test_a_secret_set_on_one_leader_is_read_by_the_other_with_the_same_key(leaders: tuple[Leader, Leader]) -> None:
    a, b = leaders
    token = "scim-tok-shared-by-both-9d2e"
    status, body = a.admin("PUT", "/api/v1/auth/secrets/scim-token", {"value": token})
    assert status == 200, body
    status, _, body = http("GET", b.url + "/scim/v2/Users", key=token)
    assert status == 200, body


def test_a_leader_with_a_key_of_its_own_is_refused_and_told_what_to_do(
    leaders: tuple[Leader, Leader], store_env: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    env = clean_env(home, OPOD_DATABASE_URL=store_env["OPOD_DATABASE_URL"])
    listen = ["--listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{free_port()}"]
    third = OpodProcess(["up", "--no-worker", *listen, *EXTRA], home, env=env)
    assert third.proc.wait(timeout=60) != 0, third.output
    output = " ".join(third.output.split())
    assert "the secrets in this store are sealed with another key" in output, output
    assert f"copy the secrets.key of a leader already using this store over {home / 'secrets.key'}" in output, output
