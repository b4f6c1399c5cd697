"""Guard attachments in the store, and the requests the guards acted on, on SQLite and PostgreSQL: an attachment
is kept once with who made it and when, its audit row commits with it, removing what is not attached is refused,
and the guard reads of the usage rows count the requests a guard was consulted on and list those it acted on."""

from __future__ import annotations

import pytest

from opod.store import GuardAttachmentRecord, InvalidInput, NotFound, Store
from opod.store.audit import AuditRow
from opod.store.usage import GuardCount
from tests.store.conftest import at
from tests.store.test_usage_events import usage


def row(action: str, target: str) -> AuditRow:
    return AuditRow(
        actor="ops@example.com", source="api", action=action, target=target, detail="{}", status=200, at=at(5)
    )


def audit_actions(store: Store) -> list[tuple[str, str]]:
    return sorted((r.action, r.target) for r in store.list_audit(since=at(0), limit=10, actor=None, contains=None))


def test_an_attachment_is_kept_once_with_who_made_it_and_when(store: Store) -> None:
    made, added = store.add_guard_attachment("project", "prj_1", "pii", by="ops@example.com", at=at(1))
    assert added and made == GuardAttachmentRecord("project", "prj_1", "pii", "ops@example.com", at(1))
    again, added = store.add_guard_attachment("project", "prj_1", "pii", by="someone else", at=at(2))
    assert not added and again == made  # the first author and time stay
    store.add_guard_attachment("org", "org_1", "pii", by="ops", at=at(3))
    store.add_guard_attachment("project", "prj_1", "secrets", by="ops", at=at(4))
    assert [(a.scope, a.scope_id, a.policy) for a in store.list_guard_attachments()] == [
        ("project", "prj_1", "pii"),
        ("org", "org_1", "pii"),
        ("project", "prj_1", "secrets"),
    ]


def test_a_change_and_its_audit_row_commit_together_and_a_refusal_writes_neither(store: Store) -> None:
    store.add_guard_attachment("key", "k_1", "pii", by="ops", audit=row("POST /api/v1/guard/attachments", "key:k_1"))
    removed = store.remove_guard_attachment(
        "key", "k_1", "pii", audit=row("DELETE /api/v1/guard/attachments", "key:k_1")
    )
    assert (removed.scope, removed.scope_id, removed.policy) == ("key", "k_1", "pii")
    assert store.list_guard_attachments() == []
    with pytest.raises(NotFound, match="policy 'pii' is not attached to key:k_1; GET /api/v1/guard lists"):
        store.remove_guard_attachment("key", "k_1", "pii", audit=row("DELETE /api/v1/guard/attachments", "key:k_1"))
    assert audit_actions(store) == [
        ("DELETE /api/v1/guard/attachments", "key:k_1"),
        ("POST /api/v1/guard/attachments", "key:k_1"),
    ]


@pytest.mark.parametrize(
    ("scope", "scope_id", "policy", "message"),
    [
        ("node", "n1", "pii", "scope 'node' is not one of org, team, project, user, key"),
        ("user", "", "pii", "scope_id must not be empty"),
        ("user", "usr_1", " ", "policy must not be empty"),
    ],
)
def test_a_bad_attachment_is_refused_and_nothing_is_written(
    store: Store, scope: str, scope_id: str, policy: str, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        store.add_guard_attachment(scope, scope_id, policy, by="ops", audit=row("POST /api/v1/guard/attachments", ""))
    assert store.list_guard_attachments() == [] and audit_actions(store) == []


def test_attachments_are_kept_across_a_reopen(open_store) -> None:
    first = open_store()
    first.add_guard_attachment("team", "team_1", "pii", by="ops", at=at(1))
    first.close()
    assert open_store().list_guard_attachments() == [GuardAttachmentRecord("team", "team_1", "pii", "ops", at(1))]


def test_the_guard_reads_count_what_the_guards_did_and_list_what_they_acted_on(store: Store) -> None:
    store.append_ledger(
        [
            usage("plain", at(10), project_id="prj_1"),  # no guard: neither counted nor listed
            usage("let", at(10), project_id="prj_2", guard_action="allow", guard_policy="hook"),  # counted only
            usage("old", at(1), project_id="prj_1", guard_action="block", guard_policy="pii", guard_category="pii"),
            usage("b1", at(11), project_id="prj_1", guard_action="block", guard_policy="pii", guard_category="pii"),
            usage("b2", at(12), project_id="prj_1", guard_action="block", guard_policy="pii", guard_category="pii"),
            usage(
                "r1",
                at(13),
                project_id="prj_2",
                guard_action="rewrite",
                guard_policy="pii",
                guard_category="pii",
                guard_rule="email",
                guard_ms=3,
            ),
        ]
    )
    assert store.guard_counts(at(5)) == [
        GuardCount("prj_1", "block", "pii", "pii", 2),
        GuardCount("prj_2", "allow", "hook", "", 1),
        GuardCount("prj_2", "rewrite", "pii", "pii", 1),
    ]
    events = store.guard_events(at(5), 2)
    assert [(e.entry, e.guard_action, e.guard_rule, e.guard_ms) for e in events] == [
        ("r1", "rewrite", "email", 3),
        ("b2", "block", "", 0),
    ]
    assert [e.entry for e in store.guard_events(at(0), 10)] == ["r1", "b2", "b1", "old"]
    assert store.guard_counts(at(20)) == [] and store.guard_events(at(20), 10) == []
