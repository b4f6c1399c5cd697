"""The catalog's durable state: whole definitions, capacity measurements per profile, the presets' state and switch."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from opod.store import ANY_NODE, Conflict, InvalidInput, NotFound, Store
from tests.store.conftest import at

SOURCE = '{"type": "huggingface", "repo": "acme/chat"}'
DEFINITION = json.dumps(
    {
        "name": "chat",
        "aliases": ["gpt-4o"],
        "scaling": {"min": 2, "idle_timeout": 600_000_000_000},
        "class": "critical",
        "profiles": [{"name": "h100", "engine": "vllm", "tp": 2}],
    }
)


def test_a_definition_is_kept_whole_with_its_first_placement_in_one_transaction(
    open_store: Callable[[], Store],
) -> None:
    store = open_store()
    record = store.add_model("chat", source_json=SOURCE, definition_json=DEFINITION, wanted="loaded", at=at(1))
    assert record.definition_json == DEFINITION
    assert [(p.node_id, p.wanted, p.updated_at) for p in store.list_placements("chat")] == [(ANY_NODE, "loaded", at(1))]
    again = open_store()  # another leader on the same database, or this one restarted
    assert again.get_model("chat").definition_json == DEFINITION
    changed = DEFINITION.replace('"critical"', '"opportunistic"')
    again.set_definition("chat", changed, engine="vllm", wanted="unloaded", at=at(2))
    assert store.get_model("chat").definition_json == changed and store.get_model("chat").engine == "vllm"
    assert [(p.wanted, p.updated_at) for p in store.list_placements("chat")] == [("unloaded", at(2))]


def test_a_refused_add_leaves_nothing_behind(store: Store) -> None:
    store.add_model("chat", source_json=SOURCE, wanted="loaded", at=at(1))
    with pytest.raises(Conflict):
        store.add_model(
            "chat", source_json=SOURCE, definition_json=DEFINITION, wanted="unloaded", preset_by="auto", at=at(2)
        )
    with pytest.raises(InvalidInput, match="definition_json of model 'other' is not valid JSON"):
        store.add_model("other", source_json=SOURCE, definition_json="{", wanted="loaded")
    with pytest.raises(InvalidInput, match="wanted 'maybe'"):
        store.add_model("other", source_json=SOURCE, wanted="maybe")
    assert [m.id for m in store.list_models()] == ["chat"]
    assert store.get_model("chat").definition_json is None
    assert [p.wanted for p in store.list_placements()] == ["loaded"]
    assert store.list_presets() == []
    with pytest.raises(NotFound):
        store.set_definition("nope", DEFINITION)


def test_removing_a_preset_declines_it_and_adding_it_again_clears_that(store: Store) -> None:
    store.add_model("qwen3-8b", source_json=SOURCE, preset_by="auto", at=at(1))
    [record] = store.list_presets()
    assert (record.name, record.added_by, record.added_at, record.declined) == ("qwen3-8b", "auto", at(1), False)
    assert store.remove_model("qwen3-8b") is True
    assert store.list_presets()[0].declined is True
    store.add_model("qwen3-8b", source_json=SOURCE, preset_by="ops@example", at=at(2))
    [record] = store.list_presets()
    assert (record.added_by, record.added_at, record.declined) == ("ops@example", at(2), False)
    store.add_model("mine", source_json=SOURCE)
    assert store.remove_model("mine") is False, "a model not added as a preset declines nothing"


def test_the_presets_switch_is_off_until_turned_on(open_store: Callable[[], Store]) -> None:
    store = open_store()
    assert store.presets_auto() is False
    store.set_presets_auto(True)
    assert open_store().presets_auto() is True
    store.set_presets_auto(False)
    assert store.presets_auto() is False


def test_capacity_is_kept_per_model_and_profile_and_goes_with_the_model(store: Store) -> None:
    store.add_model("chat", source_json=SOURCE)
    store.add_model("embed", source_json=SOURCE)
    first = json.dumps(
        {"model": "chat", "profile": "h100", "max_concurrency_at_slo": 12, "throughput_tok_per_sec": 900.5}
    )
    store.put_capacity("chat", "h100", first, measured_by="bench", at=at(1))
    store.put_capacity("chat", "l4", json.dumps({"max_concurrency_at_slo": 0}), at=at(2))
    store.put_capacity("embed", "", "{}", at=at(3))
    better = first.replace("12", "16")
    store.put_capacity("chat", "h100", better, measured_by="ops", at=at(4))
    rows = store.list_capacity("chat")
    assert [(r.profile, r.capacity_json, r.measured_by, r.measured_at) for r in rows] == [
        ("h100", better, "ops", at(4)),
        ("l4", '{"max_concurrency_at_slo": 0}', "", at(2)),
    ]
    assert [r.model_id for r in store.list_capacity()] == ["chat", "chat", "embed"]
    with pytest.raises(NotFound, match="model 'nope' has not been added"):
        store.put_capacity("nope", "h100", "{}")
    with pytest.raises(InvalidInput):
        store.put_capacity("chat", "h100", "not json")
    store.remove_model("chat")
    assert [r.model_id for r in store.list_capacity()] == ["embed"]
