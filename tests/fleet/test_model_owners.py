"""A model's owners, without HTTP: given by path or ID, kept as ``kind:ID``; one that names nothing refused with
nothing written; those stored by name before found by ID at start wherever the scope exists."""

from __future__ import annotations

import pytest

from opod.contract.admin.catalog import CatalogAdapter, CatalogModel
from opod.fleet.models import KnownModel
from opod.store import InvalidInput, NotFound
from tests.fleet.conftest import ModelsSetup as Setup
from tests.fleet.conftest import new_draft, run, sim_model


def test_a_model_is_added_with_its_owners_by_id(setup: Setup) -> None:
    definition = sim_model(
        "chat",
        owner="team:acme/ml",
        adapters=[CatalogAdapter(name="legal", source="acme/legal-lora", owner="project:acme/ml/chat")],
    )
    model = run(setup.service.add(definition, new_draft()))

    team, project = f"team:{setup.ids['acme/ml']}", f"project:{setup.ids['acme/ml/chat']}"
    stored = setup.stored("chat")
    assert stored["owner"] == team and stored["adapters"][0]["owner"] == project
    assert model.definition is not None and model.definition.owner == team


@pytest.mark.parametrize(
    ("definition", "error", "words"),
    [
        (sim_model("chat", owner="team:nope/nope"), NotFound, "owner: no team 'team:nope/nope'"),
        (sim_model("chat", owner="team:acme/nope"), NotFound, "organization 'acme' has no team 'nope'"),
        (sim_model("chat", owner="user:ada"), InvalidInput, "owner: 'user:ada' is not a scope"),
        (
            sim_model("chat", adapters=[CatalogAdapter(name="x", source="a/b", owner="project:acme/ml/none")]),
            NotFound,
            "adapters[0].owner: no project",
        ),
    ],
)
def test_a_model_whose_owner_names_nothing_is_refused_and_nothing_kept(
    setup: Setup, definition: CatalogModel, error: type[Exception], words: str
) -> None:
    draft = new_draft()
    with pytest.raises(error) as refused:
        run(setup.service.add(definition, draft))
    assert words in str(refused.value)
    assert setup.store.list_models() == [] and setup.models.ids() == [] and setup.kicks.count == 0
    assert setup.audit() == [] and not draft.committed


def test_an_owner_is_set_by_path_or_id_kept_by_id_and_an_unknown_one_refused(setup: Setup) -> None:
    run(setup.service.add(sim_model("chat"), new_draft()))
    project = f"project:{setup.ids['acme/ml/chat']}"

    model = run(setup.service.set_owner("chat", "project:acme/ml/chat", new_draft("POST /api/v1/models/{name}/owner")))
    assert model.definition is not None and model.definition.owner == project
    assert setup.stored("chat")["owner"] == project
    run(setup.service.set_owner("chat", f"org:{setup.ids['acme']}", new_draft()))
    assert setup.stored("chat")["owner"] == f"org:{setup.ids['acme']}"

    rows, kicks = len(setup.audit()), setup.kicks.count
    for owner, error, words in [
        ("team:nope/nope", NotFound, "owner: no team"),
        ("team:a/b/c", InvalidInput, "owner: 'team:a/b/c' is not a scope"),
        ("team:ghost", InvalidInput, "owner: 'team:ghost' is not a team path"),
    ]:
        draft = new_draft()
        with pytest.raises(error, match=words):
            run(setup.service.set_owner("chat", owner, draft))
        assert not draft.committed
    assert setup.stored("chat")["owner"] == f"org:{setup.ids['acme']}" == model.definition.owner
    assert (len(setup.audit()), setup.kicks.count) == (rows, kicks), "nothing written, nobody woken"

    run(setup.service.set_owner("chat", "", new_draft()))
    assert "owner" not in setup.stored("chat") and model.definition.owner is None


def test_owners_stored_by_name_are_kept_by_id_at_start_where_the_scope_exists(setup: Setup) -> None:
    for name, owner in [("named", "team:acme/ml"), ("gone", "team:acme/gone"), ("by-id", "org:" + setup.ids["acme"])]:
        definition = sim_model(name, owner=owner).model_dump_json(exclude_none=True, by_alias=True)
        setup.store.add_model(name, source_json="{}", definition_json=definition)
        setup.models.put(KnownModel(id=name, definition=CatalogModel.model_validate_json(definition)))

    assert setup.service.resolve_stored_owners() == ["named"]
    team = f"team:{setup.ids['acme/ml']}"
    assert setup.stored("named")["owner"] == team
    named = setup.models.get("named")
    assert named is not None and named.definition is not None and named.definition.owner == team
    assert setup.stored("gone")["owner"] == "team:acme/gone", "a scope that no longer exists is left as it was"

    model = run(setup.service.scale("gone", new_draft(), low=0, high=None, idle_timeout=None))
    assert model.definition is not None and model.definition.owner == "team:acme/gone", (
        "an owner left as it was does not stop another change"
    )
