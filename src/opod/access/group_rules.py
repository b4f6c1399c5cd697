"""What a provider's groups give a person: a role and memberships; one rule for OIDC, LDAP and SCIM alike.

Each provider's settings say it their own way (``auth.oidc.group_roles`` and ``group_memberships``,
``auth.ldap.roles`` and ``memberships``, ``auth.scim_groups``); each is read here into one
:class:`GroupRules`, and the rule is the same for all three:

- a group is matched by its name (or an LDAP group's DN) in any case, blanks around it and around a
  DN's commas aside (:func:`fold`);
- the role is the strongest of the roles the person's groups map to; none (``""``) when no group of
  theirs maps to one; left alone (``None``) while the provider maps no roles;
- the places are those the person's groups map to, as manager where any of them gives manager;
- a group the settings do not name is kept (SCIM keeps its groups) and shown (in the audit of what
  the groups changed), and grants nothing; a mapped place that does not exist grants nothing until
  it does, and :attr:`GroupRules.problems` says so.

Putting people in those places and taking them out is :meth:`opod.access.people.People.match_memberships`
(the store's one step, :func:`opod.store.people.match_in`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from opod.access.tenancy import Tenancy
from opod.settings.schema import LDAPSettings, OidcSettings, ScimGroupGrant
from opod.store.errors import InvalidInput, NotFound

ROLES = ("viewer", "billing", "operator", "admin")
"""The roles groups may give, weakest first: a person in several mapped groups holds the strongest."""
MEMBERSHIP_KINDS = ("org", "team", "project")
_PATH_KINDS = {1: "org", 2: "team", 3: "project"}


def fold(name: str) -> str:
    """A group's name or DN as mappings match it: lower case, no blanks at its ends or around a DN's commas."""
    return ",".join(part.strip() for part in name.lower().split(","))


@dataclass(frozen=True, slots=True)
class Place:
    """A place a group's members belong."""

    target: str
    """The org, team or project id."""
    text: str
    """The place as the settings name it."""
    role: str
    """member or manager."""


@dataclass(frozen=True, slots=True)
class GroupRules:
    """One provider's mapping, read: what each group (folded) gives; built by :meth:`for_oidc`, :meth:`for_ldap`
    or :meth:`for_scim` from the settings in force and the tenancy tree as it is now."""

    setting: str
    """The settings that hold the mapping (``auth.oidc``), as the words of :meth:`granted` name them."""
    roles: Mapping[str, str] | None = None
    """Group → role; None when the provider maps no roles (a person's role is then left alone)."""
    grants: Mapping[str, tuple[Place, ...]] = field(default_factory=dict)
    """Group → the places its members belong, those that exist."""
    missing: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Group → the places the settings name for it that do not exist (yet)."""
    problems: tuple[str, ...] = ()
    """Why each of ``missing`` grants nothing, naming the setting's field."""

    # --- reading each provider's settings ------------------------------------------------------

    @classmethod
    def for_oidc(cls, oidc: OidcSettings, tenancy: Tenancy) -> GroupRules:
        named = [
            (group, f"auth.oidc.group_memberships.{group}[{index}].target", place.target, place.role)
            for group, places in oidc.group_memberships.items()
            for index, place in enumerate(places)
        ]
        return cls._read("auth.oidc", dict(oidc.group_roles) or None, named, tenancy)

    @classmethod
    def for_ldap(cls, config: LDAPSettings, tenancy: Tenancy) -> GroupRules:
        named = [
            (mapped.group, f"auth.ldap.memberships[{index}].target", mapped.target, mapped.role)
            for index, mapped in enumerate(config.memberships)
        ]
        return cls._read("auth.ldap", dict(config.roles) or None, named, tenancy)

    @classmethod
    def for_scim(cls, scim_groups: Mapping[str, ScimGroupGrant], tenancy: Tenancy) -> GroupRules:
        """``auth.scim_groups`` names a place by its path (``acme/ml``); SCIM maps no roles."""
        named = [
            (name, f"auth.scim_groups.{name}.target", f"{_PATH_KINDS[len(g.target.split('/'))]}:{g.target}", g.role)
            for name, g in scim_groups.items()
        ]
        return cls._read("auth.scim_groups", None, named, tenancy)

    @classmethod
    def _read(
        cls,
        setting: str,
        roles: Mapping[str, str] | None,
        named: Iterable[tuple[str, str, str, str]],
        tenancy: Tenancy,
    ) -> GroupRules:
        grants: dict[str, list[Place]] = {}
        missing: dict[str, list[str]] = {}
        problems: list[str] = []
        for group, where, text, role in named:
            try:
                scope = tenancy.resolve(text, kinds=MEMBERSHIP_KINDS, field=where)
            except (InvalidInput, NotFound) as err:
                missing.setdefault(fold(group), []).append(text)
                problems.append(f"{err}; group {group} grants nothing until it does")
                continue
            grants.setdefault(fold(group), []).append(Place(scope.id, text, role))
        return cls(
            setting=setting,
            roles=None if roles is None else {fold(g): r for g, r in roles.items()},
            grants={g: tuple(p) for g, p in grants.items()},
            missing={g: tuple(t) for g, t in missing.items()},
            problems=tuple(problems),
        )

    # --- what groups give ----------------------------------------------------------------------

    @property
    def targets(self) -> frozenset[str]:
        """Every place the mapping gives (by id): the places whose memberships the groups decide."""
        return frozenset(p.target for places in self.grants.values() for p in places)

    def names(self) -> frozenset[str]:
        """The groups the mapping names, folded."""
        return frozenset(self.grants) | frozenset(self.missing) | frozenset(self.roles or ())

    def role(self, groups: Iterable[str]) -> str | None:
        """The role ``groups`` give: the strongest; ``""`` when none maps to one; None when no roles are mapped."""
        if self.roles is None:
            return None
        given = [ROLES.index(r) for g in {fold(g) for g in groups} if (r := self.roles.get(g)) is not None]
        return ROLES[max(given)] if given else ""

    def places(self, groups: Iterable[str]) -> dict[str, str]:
        """Place id → role that ``groups`` give: manager where any of them gives manager."""
        wanted: dict[str, str] = {}
        for group in {fold(g) for g in groups}:
            for place in self.grants.get(group, ()):
                if wanted.get(place.target) != "manager":
                    wanted[place.target] = place.role
        return wanted

    def granted(self, group: str) -> str:
        """What a group gives, in words, for the audit and the log."""
        folded = fold(group)
        given = [f"{p.role} of {p.text}" for p in self.grants.get(folded, ())]
        if self.roles is not None and folded in self.roles:
            given.insert(0, f"role {self.roles[folded]}")
        if given:
            return ", ".join(given)
        if folded in self.missing:
            return f"nothing yet: {self.setting} maps it to {', '.join(self.missing[folded])}, which is not there"
        return f"nothing: {self.setting} does not name it"

    def shown(self, groups: Iterable[str]) -> dict[str, str]:
        """Each of ``groups`` with what it gives (:meth:`granted`), the unmapped ones too, for an audit's detail."""
        return {group: self.granted(group) for group in sorted(set(groups))}


__all__ = ["MEMBERSHIP_KINDS", "ROLES", "GroupRules", "Place", "fold"]
