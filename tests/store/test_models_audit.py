"""A change to the models (added, redefined, pinned, measured, removed, the presets' switch) and its audit row commit
in one transaction: a change the store refuses leaves no row of its own."""

from __future__ import annotations

import pytest

from opod.store import Conflict, NotFound, Store
from opod.store.audit import AuditRow
from tests.store.conftest import at

SOURCE = '{"catalog": "llama-3.2-1b"}'
DEFINITION = '{"name": "chat"}'


def row(action: str, target: str = "model:chat") -> AuditRow:
    return AuditRow(
        actor="ops@example.com", source="api", action=action, target=target, detail="", status=200, at=at(5)
    )


def actions(store: Store) -> list[str]:
    return [r.action for r in reversed(store.list_audit(since=at(0), limit=20))]


def test_each_change_to_a_model_commits_its_audit_row(store: Store) -> None:
    store.add_model("chat", source_json=SOURCE, definition_json=DEFINITION, audit=row("POST /api/v1/models"))
    store.set_definition("chat", DEFINITION, wanted="loaded", audit=row("POST /api/v1/models/{name}/scale"))
    store.set_placement("chat", "n1", "loaded", audit=row("POST /api/v1/models/{name}/load"))
    store.put_capacity("chat", "", '{"throughput_tok_per_sec": 1}', audit=row("PUT /api/v1/models/{name}/capacity"))
    store.set_presets_auto(True, audit=row("PUT /api/v1/presets/auto", "presets.auto"))
    store.remove_model("chat", audit=row("DELETE /api/v1/models/{name}"))
    assert actions(store) == [
        "POST /api/v1/models",
        "POST /api/v1/models/{name}/scale",
        "POST /api/v1/models/{name}/load",
        "PUT /api/v1/models/{name}/capacity",
        "PUT /api/v1/presets/auto",
        "DELETE /api/v1/models/{name}",
    ]
    assert store.presets_auto() and store.list_models() == []


def test_a_refused_change_to_a_model_writes_no_audit_row(store: Store) -> None:
    store.add_model("chat", source_json=SOURCE, definition_json=DEFINITION)
    with pytest.raises(Conflict):
        store.add_model("chat", source_json=SOURCE, audit=row("POST /api/v1/models"))
    for refused in (
        lambda: store.set_definition("gone", DEFINITION, audit=row("POST /api/v1/models/{name}/class")),
        lambda: store.set_placement("gone", "n1", "loaded", audit=row("POST /api/v1/models/{name}/load")),
        lambda: store.put_capacity("gone", "", "{}", audit=row("PUT /api/v1/models/{name}/capacity")),
        lambda: store.remove_model("gone", audit=row("DELETE /api/v1/models/{name}")),
    ):
        with pytest.raises(NotFound, match="model 'gone' has not been added"):
            refused()
    assert actions(store) == []
