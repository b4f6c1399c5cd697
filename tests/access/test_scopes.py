"""The one scope parser: every form the management API takes, and refusals that name the forms."""

from __future__ import annotations

import pytest

from opod.access.scopes import Scope, ScopeRef, parse_scope
from opod.store import InvalidInput


@pytest.mark.parametrize(
    ("text", "kinds", "expected"),
    [
        ("org:acme", None, ScopeRef("org", names=("acme",), text="org:acme")),
        ("team:acme/ml", None, ScopeRef("team", names=("acme", "ml"), text="team:acme/ml")),
        ("project:acme/ml/chat", None, ScopeRef("project", names=("acme", "ml", "chat"), text="project:acme/ml/chat")),
        (
            "project:prj_0123456789abcdef",
            None,
            ScopeRef("project", id="prj_0123456789abcdef", text="project:prj_0123456789abcdef"),
        ),
        ("team_0123456789abcdef", None, ScopeRef("team", id="team_0123456789abcdef", text="team_0123456789abcdef")),
        ("user:ada@example.com", None, ScopeRef("user", names=("ada@example.com",), text="user:ada@example.com")),
        ("user:usr_42", None, ScopeRef("user", id="usr_42", text="user:usr_42")),
        ("key:k_cp_billing", None, ScopeRef("key", id="k_cp_billing", text="key:k_cp_billing")),
        ("acme/ml", ("org", "team", "project"), ScopeRef("team", names=("acme", "ml"), text="acme/ml")),
        ("acme", ("team",), None),
    ],
)
def test_each_form_reads_as_what_it_names(text: str, kinds: tuple[str, ...] | None, expected: ScopeRef | None) -> None:
    if expected is None:
        with pytest.raises(InvalidInput, match="team:ORG/TEAM"):
            parse_scope(text, kinds=kinds or ("org", "team", "project", "user", "key"))
        return
    assert parse_scope(text, kinds=kinds) == expected if kinds else parse_scope(text) == expected


def test_refusals_name_the_field_and_the_forms() -> None:
    with pytest.raises(InvalidInput, match=r"^target: 'galaxy:x' starts with 'galaxy'.*org:NAME, team:ORG/TEAM"):
        parse_scope("galaxy:x", field="target")
    with pytest.raises(InvalidInput, match="is a user scope, which is not taken here"):
        parse_scope("user:ada@example.com", kinds=("org", "team", "project"))
    with pytest.raises(InvalidInput, match="is not a team path"):
        parse_scope("team:acme")
    with pytest.raises(InvalidInput, match="give a scope"):
        parse_scope("  ")
    assert Scope("project", "prj_1").text == "project:prj_1"
