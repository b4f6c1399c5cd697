"""Added models and the placements wanted for them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from opod.store import ANY_NODE, Conflict, InvalidInput, NotFound, Store
from tests.store.conftest import at

SOURCE = '{"catalog": "llama-3.2-1b"}'
GGUF_ENTRY = json.dumps({"id": "my-model", "source": {"gguf": "/models/my.gguf"}, "context": 8192})


def test_add_get_list_and_remove_models(store: Store) -> None:
    catalog = store.add_model("llama-3.2-1b", source_json=SOURCE, at=at(1))
    outside = store.add_model(
        "my-model", source_json='{"gguf": "/models/my.gguf"}', entry_json=GGUF_ENTRY, engine="llama.cpp", at=at(2)
    )
    assert store.get_model("llama-3.2-1b") == catalog
    assert (catalog.source_json, catalog.entry_json, catalog.engine, catalog.added_at) == (SOURCE, None, "", at(1))
    assert store.get_model("my-model").entry_json == GGUF_ENTRY and outside.engine == "llama.cpp"
    assert [m.id for m in store.list_models()] == ["llama-3.2-1b", "my-model"]
    store.remove_model("llama-3.2-1b")
    assert store.list_models() == [outside]
    with pytest.raises(NotFound, match="model 'llama-3.2-1b' has not been added"):
        store.get_model("llama-3.2-1b")
    with pytest.raises(NotFound, match="model 'llama-3.2-1b' has not been added"):
        store.remove_model("llama-3.2-1b")


def test_adding_a_model_twice_is_a_conflict(store: Store) -> None:
    first = store.add_model("qwen", source_json=SOURCE, at=at(1))
    with pytest.raises(Conflict, match="model 'qwen' is already added; remove it first or add it under another name"):
        store.add_model("qwen", source_json='{"catalog": "other"}', at=at(2))
    assert store.list_models() == [first]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"source_json": "catalog"}, "source_json of model 'm' is not valid JSON"),
        ({"entry_json": "{"}, "entry_json of model 'm' is not valid JSON"),
        ({"engine": None}, "engine must be text"),
    ],
)
def test_bad_model_input_is_refused(store: Store, fields: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"source_json": SOURCE}
    args.update(fields)
    with pytest.raises(InvalidInput, match=message):
        store.add_model("m", **args)
    assert store.list_models() == []


def test_a_placement_is_set_replaced_and_removed(store: Store) -> None:
    store.add_model("m", source_json=SOURCE)
    placed = store.set_placement("m", ANY_NODE, "loaded", at=at(1))
    assert (placed.model_id, placed.node_id, placed.wanted, placed.updated_at) == ("m", "*", "loaded", at(1))
    on_a = store.set_placement("m", "node-a", "loaded", at=at(2))
    replaced = store.set_placement("m", ANY_NODE, "unloaded", at=at(3))
    assert store.list_placements() == store.list_placements("m") == [replaced, on_a]
    assert [(p.node_id, p.wanted, p.updated_at) for p in store.list_placements("m")] == [
        ("*", "unloaded", at(3)),
        ("node-a", "loaded", at(2)),
    ]
    store.remove_placement("m", "node-a")
    assert store.list_placements() == [replaced]
    with pytest.raises(NotFound, match="model 'm' has no placement on node 'node-a'"):
        store.remove_placement("m", "node-a")


def test_placements_list_by_model_then_node(store: Store) -> None:
    for model in ("b", "a"):
        store.add_model(model, source_json=SOURCE)
        for node in ("n2", "*", "n1"):
            store.set_placement(model, node, "loaded", at=at(0))
    assert [(p.model_id, p.node_id) for p in store.list_placements()] == [
        ("a", "*"),
        ("a", "n1"),
        ("a", "n2"),
        ("b", "*"),
        ("b", "n1"),
        ("b", "n2"),
    ]
    assert [p.node_id for p in store.list_placements("b")] == ["*", "n1", "n2"]


def test_removing_a_model_removes_its_placements(store: Store) -> None:
    store.add_model("gone", source_json=SOURCE)
    store.add_model("kept", source_json=SOURCE)
    store.set_placement("gone", ANY_NODE, "loaded")
    store.set_placement("gone", "node-a", "unloaded")
    store.set_placement("kept", "node-a", "loaded")
    store.remove_model("gone")
    assert [(p.model_id, p.node_id) for p in store.list_placements()] == [("kept", "node-a")]
    store.add_model("gone", source_json=SOURCE)
    assert store.list_placements("gone") == []  # nothing came back with the name


def test_placements_of_a_model_that_was_not_added_are_refused(store: Store) -> None:
    with pytest.raises(NotFound, match="model 'ghost' has not been added"):
        store.set_placement("ghost", ANY_NODE, "loaded")
    with pytest.raises(NotFound, match="model 'ghost' has not been added"):
        store.list_placements("ghost")
    with pytest.raises(NotFound, match="model 'ghost' has not been added"):
        store.remove_placement("ghost", ANY_NODE)
    assert store.list_placements() == []


def test_a_bad_wanted_state_is_refused(store: Store) -> None:
    store.add_model("m", source_json=SOURCE)
    with pytest.raises(InvalidInput, match="wanted 'running' is not one of loaded, unloaded"):
        store.set_placement("m", ANY_NODE, "running")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="node id must not be empty"):
        store.set_placement("m", "", "loaded")
    assert store.list_placements() == []
