"""The models' one writer, without HTTP: each change in the store with its audit row, then in memory, then the
reconciler woken; a refusal leaves all three as they were."""

from __future__ import annotations

import json

import pytest

from opod.contract.admin.catalog import CatalogModel, CatalogScaling
from opod.contract.admin.models import BenchCapacity
from opod.fleet.models import ANY_NODE
from opod.fleet.state import NodeState
from opod.store import Conflict, InvalidInput, NotFound
from tests.fleet.conftest import ModelsSetup as Setup
from tests.fleet.conftest import new_draft, run, sim_model


def test_a_model_is_added_whole_with_its_audit_row(setup: Setup) -> None:
    draft = new_draft()
    model = run(setup.service.add(sim_model("chat", aliases=["big"], description="the team's chat"), draft))

    assert setup.stored("chat") == {
        "name": "chat",
        "aliases": ["big"],
        "description": "the team's chat",
        "profiles": [{"engine": "sim"}],
    }
    assert setup.placements("chat") == {ANY_NODE: "loaded"}
    assert setup.models.get("chat") is model and setup.models.named("big") is model and model.engine == "sim"
    assert model.wanted == {ANY_NODE: "loaded"} and setup.kicks.count == 1
    [row] = setup.audit()
    assert (row.action, row.target, row.status, row.actor) == ("POST /api/v1/models", "model:chat", 200, "ops@example")
    assert draft.committed


@pytest.mark.parametrize(
    ("definition", "error", "words"),
    [
        (sim_model("Chat"), InvalidInput, "name: 'Chat' must be lower-case"),
        (sim_model("chat", owner="acme"), InvalidInput, "owner: 'acme' is not a scope"),
        (sim_model("chat", scaling=CatalogScaling(min=3, max=1)), InvalidInput, "scaling: min 3 is above max 1"),
        (CatalogModel(name="nowhere"), InvalidInput, "source: 'nowhere' is not in the catalog"),
    ],
)
def test_a_refused_model_leaves_store_memory_and_audit_as_they_were(
    setup: Setup, definition: CatalogModel, error: type[Exception], words: str
) -> None:
    draft = new_draft()
    with pytest.raises(error) as refused:
        run(setup.service.add(definition, draft))
    assert words in str(refused.value)
    assert setup.store.list_models() == [] and setup.models.ids() == [] and setup.kicks.count == 0
    assert setup.audit() == [] and not draft.committed, "the listener records the refusal with its status"


def test_a_name_or_alias_taken_is_a_conflict(setup: Setup) -> None:
    run(setup.service.add(sim_model("chat", aliases=["big"]), new_draft()))
    for definition, words in [
        (sim_model("chat"), "name: model 'chat' is already in the catalog"),
        (sim_model("other", aliases=["big"]), "aliases[0]: 'big' is already a name of model 'chat'"),
        (sim_model("big"), "name: 'big' is already a name of model 'chat'"),
    ]:
        with pytest.raises(Conflict, match=words.replace("[", r"\[").replace("]", r"\]")):
            run(setup.service.add(definition, new_draft()))
    assert [m.id for m in setup.store.list_models()] == ["chat"] and len(setup.audit()) == 1


def test_a_change_the_store_refuses_leaves_memory_untouched(setup: Setup) -> None:
    model = run(setup.service.add(sim_model("chat"), new_draft()))
    setup.store.remove_model("chat")  # another leader removed it meanwhile
    draft = new_draft("POST /api/v1/models/{name}/class")
    with pytest.raises(NotFound, match="model 'chat' has not been added"):
        run(setup.service.set_class("chat", "critical", draft))
    assert model.definition is not None and model.definition.class_ is None and setup.kicks.count == 1
    assert not draft.committed and [r.action for r in setup.audit()] == ["POST /api/v1/models"]


def test_scaling_to_zero_unloads_it_everywhere_and_back_loads_it(setup: Setup) -> None:
    setup.fleet.restore(NodeState(id="n1", address="127.0.0.1:1"))
    run(setup.service.add(sim_model("chat"), new_draft()))
    run(setup.service.pin("chat", "n1", "loaded", new_draft("POST /api/v1/models/{name}/load")))
    assert setup.placements("chat") == {ANY_NODE: "loaded", "n1": "loaded"}

    model = run(setup.service.scale("chat", new_draft(), low=0, high=None, idle_timeout=None))
    assert setup.placements("chat") == {ANY_NODE: "unloaded", "n1": "unloaded"} == model.wanted
    assert setup.stored("chat")["scaling"] == {"min": 0}

    model = run(setup.service.scale("chat", new_draft(), low=2, high=3, idle_timeout=None))
    assert setup.placements("chat")[ANY_NODE] == "loaded" == model.wanted[ANY_NODE]
    assert setup.stored("chat")["scaling"] == {"min": 2, "max": 3}

    with pytest.raises(InvalidInput, match="scaling: min 5 is above max 1"):
        run(setup.service.scale("chat", new_draft(), low=5, high=1, idle_timeout=None))
    assert setup.stored("chat")["scaling"] == {"min": 2, "max": 3}
    assert [r.target for r in setup.audit()] == ["model:chat"] * 4


def test_pins_name_a_known_node_or_change_the_scaling_on_any(setup: Setup) -> None:
    run(setup.service.add(sim_model("chat", scaling=CatalogScaling(min=0)), new_draft()))
    assert setup.placements("chat") == {}, "added without replicas: placed nowhere yet"
    with pytest.raises(NotFound, match="node 'n9' is not known"):
        run(setup.service.pin("chat", "n9", "loaded", new_draft()))

    model = run(setup.service.pin("chat", ANY_NODE, "loaded", new_draft()))
    assert setup.stored("chat")["scaling"] == {"min": 1} and model.wanted == {ANY_NODE: "loaded"}
    model = run(setup.service.pin("chat", ANY_NODE, "unloaded", new_draft()))
    assert setup.stored("chat")["scaling"] == {"min": 0} and model.wanted == {ANY_NODE: "unloaded"}
    assert len(setup.audit()) == 3


def test_class_and_resources_change_the_definition(setup: Setup) -> None:
    run(setup.service.add(sim_model("chat"), new_draft()))
    with pytest.raises(InvalidInput, match="class: 'gold' is not a capacity class"):
        run(setup.service.set_class("chat", "gold", new_draft()))
    run(setup.service.set_class("chat", "critical", new_draft()))
    assert setup.stored("chat")["class"] == "critical"

    with pytest.raises(NotFound, match="profile: 'tpu' is not a profile of 'chat'"):
        run(setup.service.set_resources("chat", new_draft(), profile="tpu", memory_gb=1, cpu_cores=None))
    with pytest.raises(InvalidInput, match="memory_gb: -1 cannot be negative"):
        run(setup.service.set_resources("chat", new_draft(), profile="", memory_gb=-1, cpu_cores=None))
    model = run(setup.service.set_resources("chat", new_draft(), profile="", memory_gb=8, cpu_cores=2))
    [profile] = setup.stored("chat")["profiles"]
    assert (profile["min_memory_gb"], profile["cpu_cores"]) == (8, 2)
    assert model.definition is not None and model.definition.profiles is not None
    assert model.definition.profiles[0].min_memory_gb == 8 and len(setup.audit()) == 3


def test_a_declared_model_stays_and_another_is_removed_with_its_audit_row(setup: Setup) -> None:
    run(setup.service.add(CatalogModel(name="smollm2-135m-instruct"), new_draft()))
    run(setup.service.add(sim_model("chat"), new_draft()))
    with pytest.raises(Conflict, match="scale it to 0"):
        run(setup.service.remove("smollm2-135m-instruct", new_draft()))

    draft = new_draft("DELETE /api/v1/models/{name}")
    model = run(setup.service.remove("chat", draft))
    assert [m.id for m in setup.store.list_models()] == ["smollm2-135m-instruct"]
    assert model.removed and model.wanted == {ANY_NODE: "unloaded"} and setup.models.active("chat") is None
    assert setup.audit()[0].action == "DELETE /api/v1/models/{name}" and draft.committed
    with pytest.raises(NotFound, match="model 'chat' is not in the catalog"):
        run(setup.service.remove("chat", new_draft()))


def test_a_capacity_measurement_is_kept_with_who_measured_it(setup: Setup) -> None:
    run(setup.service.add(sim_model("chat"), new_draft()))
    draft = new_draft("PUT /api/v1/models/{name}/capacity")
    kept = run(setup.service.record_capacity("chat", BenchCapacity(throughput_tok_per_sec=120.0), draft))
    assert kept.model == "chat" and kept.measured_at is not None
    [record] = run(setup.service.measurements("chat"))
    assert (record.measured_by, json.loads(record.capacity_json)["throughput_tok_per_sec"]) == ("ops@example", 120.0)
    assert setup.audit()[0].target == "model:chat"

    draft = new_draft()
    with pytest.raises(InvalidInput, match="suggested_kv_ceiling: 2.0 is a share"):
        run(
            setup.service.record_capacity(
                "chat", BenchCapacity(throughput_tok_per_sec=1.0, suggested_kv_ceiling=2.0), draft
            )
        )
    with pytest.raises(NotFound, match="name: 'nope' is not a model's name or alias"):
        run(setup.service.record_capacity("nope", BenchCapacity(throughput_tok_per_sec=1.0), draft))
    assert not draft.committed and len(run(setup.service.measurements())) == 1
