"""The operator's changes of a node commit with their audit row, in one transaction; a change refused writes none."""

from __future__ import annotations

import pytest

from opod.store import NotFound, Store
from opod.store.audit import AuditRow
from tests.store.conftest import at
from tests.store.test_nodes import register


def row(action: str) -> AuditRow:
    return AuditRow(actor="ops", source="api", action=action, target="node:node-a", detail="", status=200, at=at(5))


def rows(store: Store) -> list[tuple[str, str]]:
    return [(r.action, r.target) for r in store.list_audit(since=at(0), limit=10)]


def test_state_labels_builds_release_and_forgetting_commit_with_their_rows(store: Store) -> None:
    register(store)
    assert store.set_state("node-a", drained=False, cordoned=True, audit=row("state")).cordoned
    labelled = store.set_operator_side("node-a", labels={"rack": "r7"}, audit=row("labels"))
    assert labelled.operator_labels == {"rack": "r7"}
    store.set_operator_side("node-a", engine_builds={"vllm": "cu129"}, wanted_version="0.6.0", audit=row("builds"))
    assert store.get_node("node-a").engine_builds == {"vllm": "cu129"}
    store.delete_node("node-a", audit=row("forget"))
    assert store.list_nodes() == []
    assert rows(store) == [(a, "node:node-a") for a in ("forget", "builds", "labels", "state")]


def test_a_change_of_a_node_not_stored_writes_no_row(store: Store) -> None:
    with pytest.raises(NotFound, match="node 'ghost' is not registered"):
        store.set_state("ghost", drained=True, cordoned=False, audit=row("state"))
    with pytest.raises(NotFound):
        store.set_operator_side("ghost", labels={"a": "b"}, audit=row("labels"))
    with pytest.raises(NotFound):
        store.delete_node("ghost", audit=row("forget"))
    assert rows(store) == [] and store.list_nodes() == []
