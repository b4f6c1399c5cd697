"""Scopes as every area writes them: ``org:NAME``, ``team:ORG/TEAM``, ``project:ORG/TEAM/PROJECT``,
``user:ID|EMAIL``, ``key:ID``, or a bare ID. One parser for every area; it checks syntax only
(:meth:`opod.access.tenancy.Tenancy.resolve` finds what a reference names).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from opod.store.errors import InvalidInput

ScopeKind = Literal["org", "team", "project", "user", "key"]
KINDS: tuple[ScopeKind, ...] = ("org", "team", "project", "user", "key")
TENANCY_KINDS: tuple[ScopeKind, ...] = ("org", "team", "project")

ID_PREFIXES: dict[str, ScopeKind] = {"org_": "org", "team_": "team", "prj_": "project", "usr_": "user", "k_": "key"}
"""How a bare ID says what it is."""
_ID = re.compile(r"(org|team|prj|usr|k)_[A-Za-z0-9_]+")
_DEPTH: dict[str, int] = {"org": 1, "team": 2, "project": 3}
_FORMS: dict[str, str] = {
    "org": "org:NAME",
    "team": "team:ORG/TEAM",
    "project": "project:ORG/TEAM/PROJECT",
    "user": "user:ID or user:EMAIL",
    "key": "key:ID",
}


@dataclass(frozen=True, slots=True)
class Scope:
    """A scope by ID, as answers name it."""

    kind: ScopeKind
    id: str

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True, slots=True)
class ScopeRef:
    """What a scope text says, before it is looked up: an ID, or a path of names (or a person's email)."""

    kind: ScopeKind
    id: str = ""
    names: tuple[str, ...] = ()
    text: str = ""

    @property
    def by_id(self) -> bool:
        return bool(self.id)


def forms(kinds: Collection[str]) -> str:
    """The forms a caller may write for ``kinds``, for refusals."""
    return ", ".join(_FORMS[k] for k in KINDS if k in kinds) + ", or an ID"


def id_kind(text: str) -> ScopeKind | None:
    """The kind a bare ID names by its prefix, or None when ``text`` is not shaped like an ID."""
    if not _ID.fullmatch(text):
        return None
    return next(kind for prefix, kind in ID_PREFIXES.items() if text.startswith(prefix))


def parse_scope(text: str, *, kinds: Collection[str] = KINDS, field: str = "scope") -> ScopeRef:
    """Read a scope text; raises :class:`InvalidInput` naming ``field`` and the forms allowed."""
    allowed = [k for k in KINDS if k in kinds]
    if not allowed:
        raise ValueError("parse_scope needs at least one kind")

    def refuse(why: str) -> InvalidInput:
        return InvalidInput(f"{field}: {text!r} {why}; write {forms(allowed)}")

    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{field}: give a scope; write {forms(allowed)}")
    value = text.strip()
    kind_text, colon, rest = value.partition(":")
    if colon:
        if kind_text not in KINDS:
            raise refuse(f"starts with {kind_text!r}, which is not a kind of scope")
        kind: ScopeKind = kind_text
        if kind not in allowed:
            raise refuse(f"is a {kind} scope, which is not taken here")
        if not rest:
            raise refuse("names nothing after the colon")
    else:
        found = id_kind(value)
        if found is not None:
            if found not in allowed:
                raise refuse(f"is the ID of a {found}, which is not taken here")
            return ScopeRef(found, id=value, text=value)
        # A bare path: its depth says its kind, unless only one kind is taken.
        rest = value
        depth = len(value.split("/"))
        tenancy = [k for k in allowed if k in _DEPTH]
        matching = [k for k in tenancy if _DEPTH[k] == depth]
        if len(allowed) == 1 and allowed[0] in ("user", "key"):
            matching = [allowed[0]]
        if not matching:
            raise refuse("is neither an ID nor a path of the depth taken here")
        kind = matching[0]
    if kind == "key":
        return ScopeRef("key", id=rest, text=value)
    if kind == "user":
        return (
            ScopeRef("user", id=rest, text=value)
            if id_kind(rest) == "user"
            else ScopeRef("user", names=(rest,), text=value)
        )
    if id_kind(rest) == kind:
        return ScopeRef(kind, id=rest, text=value)
    names = tuple(rest.split("/"))
    if len(names) != _DEPTH[kind] or not all(names):
        raise refuse(f"is not a {kind} path ({_FORMS[kind]})")
    return ScopeRef(kind, names=names, text=value)


def check_scope(text: str, kinds: tuple[str, ...], field: str, /) -> ScopeRef:
    """:func:`parse_scope` as the settings read the scopes a body names (``opod.settings.service.ScopeSyntax``)."""
    return parse_scope(text, kinds=kinds, field=field)


__all__ = [
    "KINDS",
    "TENANCY_KINDS",
    "Scope",
    "ScopeKind",
    "ScopeRef",
    "check_scope",
    "forms",
    "id_kind",
    "parse_scope",
]
