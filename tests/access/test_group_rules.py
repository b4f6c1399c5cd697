"""What a provider's groups give, one rule for OIDC, LDAP and SCIM: each provider's settings read into it give the
same role and places for the same groups, and a group the settings do not name grants nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.access.group_rules import GroupRules
from opod.access.tenancy import Tenancy
from opod.settings.schema import LDAPSettings, OidcSettings
from opod.settings.text import parse_settings
from opod.store import Store


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Tenancy, dict[str, str]]]:
    with Store.open(f"sqlite:///{tmp_path / 'opod.db'}") as store:
        tenancy = Tenancy.load(store)

        async def build() -> dict[str, str]:
            acme = await tenancy.create("org", "acme", None)
            ml = await tenancy.create("team", "ml", "acme")
            chat = await tenancy.create("project", "chat", "acme/ml")
            return {"acme": acme.id, "acme/ml": ml.id, "acme/ml/chat": chat.id}

        yield tenancy, asyncio.run(build())


def _oidc(**fields: object) -> OidcSettings:
    return OidcSettings.model_validate(fields)


def _three(tenancy: Tenancy) -> list[GroupRules]:
    """The same mapping written in each provider's settings: ML engineers join acme/ml, chat leads manage acme/ml
    (and chat), a group that names a team that is not there."""
    oidc = _oidc(
        group_memberships={
            "ML-Engineers": [{"target": "team:acme/ml"}],
            "chat-leads": [{"target": "team:acme/ml", "role": "manager"}, {"target": "project:acme/ml/chat"}],
            "ghosts": [{"target": "team:acme/gone"}],
        }
    )
    ldap = LDAPSettings.model_validate(
        {
            "memberships": [
                {"group": "ML-Engineers", "target": "team:acme/ml"},
                {"group": "chat-leads", "target": "team:acme/ml", "role": "manager"},
                {"group": "chat-leads", "target": "project:acme/ml/chat"},
                {"group": "ghosts", "target": "team:acme/gone"},
            ]
        }
    )
    scim = parse_settings(
        "auth:\n  scim_groups:\n    ML-Engineers: acme/ml\n    chat-leads: {target: acme/ml, role: manager}\n"
        "    ghosts: acme/gone\n"
    ).auth.scim_groups
    return [GroupRules.for_oidc(oidc, tenancy), GroupRules.for_ldap(ldap, tenancy), GroupRules.for_scim(scim, tenancy)]


def test_the_three_providers_give_the_same_places_for_the_same_groups(tree: tuple[Tenancy, dict[str, str]]) -> None:
    tenancy, ids = tree
    for rules in _three(tenancy):
        assert rules.places(["ml-engineers"]) == {ids["acme/ml"]: "member"}
        assert rules.places(["ML-ENGINEERS ", "Chat-Leads"])[ids["acme/ml"]] == "manager"  # in any case; manager wins
        assert rules.places(["marketing"]) == {} and rules.places([]) == {}
        assert ids["acme/ml"] in rules.targets and ids["acme"] not in rules.targets
        assert rules.role(["chat-leads"]) is None  # no roles mapped: a person's role is left alone
        assert rules.granted("Marketing") == f"nothing: {rules.setting} does not name it"
        assert rules.granted("GHOSTS").startswith(f"nothing yet: {rules.setting} maps it to ")
        assert rules.granted("ml-engineers").startswith("member of ")
        (problem,) = rules.problems
        assert "no team" in problem and problem.endswith("group ghosts grants nothing until it does")


def test_a_person_holds_the_strongest_role_their_groups_give_and_none_when_no_group_maps(
    tree: tuple[Tenancy, dict[str, str]],
) -> None:
    tenancy, _ = tree
    oidc = GroupRules.for_oidc(_oidc(group_roles={"Viewers": "viewer", "fleet-admins": "admin"}), tenancy)
    ldap = GroupRules.for_ldap(
        LDAPSettings.model_validate({"roles": {"Viewers": "viewer", "cn=fleet-admins,ou=groups": "admin"}}), tenancy
    )
    assert oidc.role(["viewers", "Fleet-Admins", "other"]) == "admin"
    assert ldap.role(["viewers", "cn=fleet-admins, ou=groups"]) == "admin"  # a DN matched blanks aside
    for rules in (oidc, ldap):
        assert rules.role(["VIEWERS"]) == "viewer"
        assert rules.role(["other"]) == "" and rules.role([]) == ""
        assert rules.places(["viewers"]) == {} and not rules.targets
    assert oidc.shown(["viewers", "other"]) == {
        "other": "nothing: auth.oidc does not name it",
        "viewers": "role viewer",
    }
