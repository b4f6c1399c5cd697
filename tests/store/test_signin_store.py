"""Sign-in's state in the store, on SQLite and PostgreSQL: passwords, sessions, failed sign-ins in their window."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opod.store import Store
from opod.store.audit import AuditRow
from opod.store.errors import NotFound
from opod.store.signin import SessionRecord
from tests.store.conftest import at


def test_a_password_is_kept_replaced_and_refused_for_nobody(store: Store) -> None:
    person = store.create_user(email="ada@example.com", password_hash="$argon2id$first")
    assert store.password_hash(person.id) == "$argon2id$first"
    store.set_password_hash(person.id, "$argon2id$second", at=at(1))
    assert store.password_hash(person.id) == "$argon2id$second"
    assert store.password_hash(store.create_user(email="bob@example.com").id) is None
    with pytest.raises(NotFound):
        store.set_password_hash("usr_nobody", "$argon2id$x")


def test_a_session_is_found_with_its_person_touched_and_ended_alone_or_with_all_of_theirs(store: Store) -> None:
    person = store.create_user(email="ada@example.com")
    audit = AuditRow("ada@example.com", "web", "POST /signin", f"user:{person.id}", "", 200, at(0))
    for name in ("s1", "s2"):
        store.create_session(SessionRecord(name, person.id, at(0), at(0), at(3600), "127.0.0.1"), audit=audit)
    found = store.find_session("s1")
    assert found is not None and found[1].id == person.id and found[1].last_login_at == at(0)
    store.touch_session("s1", at(60))
    assert (found := store.find_session("s1")) is not None and found[0].seen_at == at(60)
    assert store.end_session("s1") is True and store.end_session("s1") is False
    assert store.end_sessions_of(person.id) == 1 and store.find_session("s2") is None
    assert [r.action for r in store.list_audit()] == ["POST /signin", "POST /signin"]


def test_ended_sessions_are_pruned_by_their_end_and_their_idle_time(store: Store) -> None:
    person = store.create_user(email="ada@example.com")
    store.create_session(SessionRecord("old", person.id, at(0), at(0), at(100), ""))
    store.create_session(SessionRecord("idle", person.id, at(0), at(0), at(10_000), ""))
    store.create_session(SessionRecord("live", person.id, at(0), at(500), at(10_000), ""))
    assert store.prune_sessions(at(600), timedelta(seconds=300)) == 2
    assert store.find_session("live") is not None and store.find_session("idle") is None


def test_failed_sign_ins_count_in_their_window_and_start_again_after_it(store: Store) -> None:
    subjects = ["account:ada@example.com", "address:10.0.0.1"]
    for second in (0, 1, 2):
        store.count_signin_failure(subjects, at=at(second), window_from=at(second) - timedelta(seconds=60))
    assert store.signin_failures(subjects, at(-1)) == {s: (3, at(0)) for s in subjects}
    store.count_signin_failure(subjects[:1], at=at(100), window_from=at(40))  # the window began at 0: over
    assert store.signin_failures(subjects, at(40)) == {subjects[0]: (1, at(100))}
    store.clear_signin_failures(subjects[0])
    assert store.signin_failures(subjects, at(-1)) == {subjects[1]: (3, at(0))}
