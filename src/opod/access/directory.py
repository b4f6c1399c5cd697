"""Sign-in checked by a directory (``auth.ldap``), and opod's people kept in step with it.

A person who signs in through the directory gets an account (or has theirs updated): e-mail and
name from the directory, their role from the groups ``auth.ldap.roles`` maps, their memberships in
the organizations, teams and projects ``auth.ldap.memberships`` maps. Such an account is the
directory's (``external_id`` ``ldap:LOGIN``): its state, its role (while ``roles`` maps any group)
and its memberships in mapped places follow the directory, at each sign-in and each sync; a person
gone from the directory or disabled there is suspended (their keys refused on ``/v1``) and
reinstated when back. Every change goes through :class:`~opod.access.people.People`, audited with
the actor ``ldap``.

An empty password is refused before anything is sent to the directory: many servers take a simple
bind with a DN and no password as an anonymous bind, and answer it with success.

The LDAP calls (:mod:`opod.access.directory_ldap`, over ldap3) are imported when a directory is first
used: every leader builds a :class:`Directory` at start, few have one, and ldap3 is slow to import.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from opod.access.group_rules import GroupRules
from opod.access.people import DISABLED, People
from opod.access.scopes import check_scope
from opod.access.secrets import AuthSecrets
from opod.access.tenancy import Tenancy
from opod.contract.admin.tenancy import CheckView, DirectorySyncView, LDAPTestView, LDAPView
from opod.settings.holder import SettingsHolder
from opod.settings.schema import LDAPSettings
from opod.settings.text import Problem, SettingsInvalid, parse_settings
from opod.store.audit import SOURCE_LEADER, AuditRow, detail_text
from opod.store.errors import InvalidInput, StoreError
from opod.store.offloop import run_sync
from opod.store.people import UserRecord, new_user_id

if TYPE_CHECKING:
    from opod.access.directory_ldap import Found

log = logging.getLogger("opod.access")

P = ParamSpec("P")
R = TypeVar("R")

ACTOR = "ldap"
"""The actor of the audit rows of what the directory changes, and ``by`` of the memberships it makes."""
EXTERNAL_PREFIX = "ldap:"
"""``external_id`` of an account the directory keeps: ``ldap:`` and the login, in lower case."""
WRONG = "wrong username or password"
"""The one refusal for an unknown person and a wrong password, so neither tells which it was."""
EMPTY = "send a password: an empty one is never tried against the directory"
ERROR_MAX = 2000
"""Characters of a sync's problems kept in its ``error``."""


class DirectoryRefused(Exception):
    """This sign-in is refused; ``reason`` says why, in words a person may be shown."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DirectoryDown(Exception):
    """The directory cannot be used now (no server answered, the service account refused, LDAP off); ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DirectorySync:
    """What one reading of the whole directory did."""

    at: datetime
    people: int = 0
    """People the directory lists (those the user filter finds)."""
    accounts: int = 0
    """Accounts made for people new to opod."""
    suspended: int = 0
    reinstated: int = 0
    roles_changed: int = 0
    error: str = ""
    """Why it stopped, or what it could not apply; empty when all went well."""

    def view(self) -> DirectorySyncView:
        return DirectorySyncView(
            at=self.at,
            people=self.people,
            accounts=self.accounts,
            suspended=self.suspended,
            reinstated=self.reinstated,
            roles_changed=self.roles_changed,
            error=self.error or None,
        )


@dataclass(frozen=True, slots=True)
class _Kept:
    user: UserRecord
    created: bool = False
    suspended: bool = False
    reinstated: bool = False
    role_changed: bool = False


class Directory:
    """Sign-in against ``auth.ldap``'s directory, its sync, its view and the trying of a block before it is kept."""

    def __init__(self, settings: SettingsHolder, secrets: AuthSecrets, people: People, tenancy: Tenancy) -> None:
        self._settings = settings
        self._secrets = secrets
        self._people = people
        self._tenancy = tenancy
        self._trouble: tuple[LDAPSettings, str] | None = None
        """Why the settings in force could not be used at the last try, with those settings."""
        self._last: DirectorySync | None = None
        self._syncing = asyncio.Lock()

    # --- what callers ask ----------------------------------------------------------------------

    def configured(self) -> bool:
        """Whether the settings name a directory (``auth.ldap.urls``)."""
        return bool(self._settings.current.auth.ldap.urls)

    async def sign_in(self, username: str, password: str) -> UserRecord:
        """The person ``username`` names, checked by the directory with ``password``, their account made or brought
        in step. ``DirectoryRefused`` (the same reason for an unknown person and a wrong password),
        ``DirectoryDown`` when the directory cannot be used."""
        from opod.access.directory_ldap import DirectoryError, NotThisPerson, authenticate

        if not password or not password.strip():
            raise DirectoryRefused(EMPTY)
        login = username.strip()
        if not login:
            raise DirectoryRefused(WRONG)
        config = self._config()
        service_password = await self._service_password(config)
        try:
            found = await self._off_loop(config, authenticate, config, service_password, login, password)
        except NotThisPerson as err:
            log.info("LDAP sign-in of %r refused: %s", login, err)
            raise DirectoryRefused(WRONG) from None
        except DirectoryError as err:
            raise self._down(config, str(err)) from None
        self._working(config)
        if not found.email:
            raise DirectoryRefused(
                f"the directory has no {config.email_attribute} for {login}; opod's accounts need an e-mail address"
            )
        try:
            kept = await self._keep(found, self._rules(config), self._accounts(), "LDAP sign-in")
        except StoreError as err:
            raise DirectoryRefused(f"{login} cannot sign in: {err}") from None
        if found.disabled:
            raise DirectoryRefused(f"the directory has {login}'s account disabled; ask its administrators")
        return kept.user

    async def sync(self) -> DirectorySync:
        """Read everyone and bring their accounts in step: made, updated, suspended (gone or disabled there),
        reinstated, roles and memberships as the groups say. Its result is ``last_sync``."""
        async with self._syncing:
            result = await self._sync(datetime.now(UTC))
            self._last = result
            return result

    def view(self) -> LDAPView:
        """``auth.ldap`` as it is in force, why it cannot be used (``off``) and how the last sync went."""
        config = self._settings.current.auth.ldap
        return LDAPView(
            urls=config.urls or None,
            base_dn=config.base_dn or None,
            bind_dn=config.bind_dn or None,
            label=config.label or None,
            off=self._off(config) or None,
            last_sync=self._last.view() if self._last is not None else None,
        )

    async def test(self, settings_yaml: str, password: str | None) -> LDAPTestView:
        """Try an ``auth.ldap`` block (the one in force when empty): each step a check; nothing changes."""
        from opod.access.directory_ldap import DirectoryError, try_directory

        config, said = self._parse(settings_yaml)
        checks = [CheckView(step="settings", ok=config is not None, detail=said)]
        if config is None:
            return LDAPTestView(ok=False, checks=checks)
        if config.memberships:
            rules = self._rules(config)
            found = (
                f"{len(config.memberships) - len(rules.problems)} of the places auth.ldap.memberships names are here"
            )
            checks.append(CheckView(step="mappings", ok=not rules.problems, detail="; ".join(rules.problems) or found))
        if not password and config.bind_dn:
            password = await self._secrets.named(config.bind_password)
        try:
            steps = await self._off_loop(config, try_directory, config, password)
        except DirectoryError as err:
            steps = [("connect", False, str(err))]
        checks += [CheckView(step=step, ok=ok, detail=detail) for step, ok, detail in steps]
        return LDAPTestView(ok=all(c.ok for c in checks), checks=checks)

    # --- the sync ------------------------------------------------------------------------------

    async def _sync(self, at: datetime) -> DirectorySync:
        from opod.access.directory_ldap import DirectoryError, read_all

        try:
            config = self._config()
            service_password = await self._service_password(config)
            try:
                found = await self._off_loop(config, read_all, config, service_password)
            except DirectoryError as err:
                raise self._down(config, str(err)) from None
        except DirectoryDown as err:
            return DirectorySync(at=at, error=err.reason)
        self._working(config)
        rules = self._rules(config)
        problems = list(rules.problems)
        listed: dict[str, Found] = {}
        present = {_external(person) for person in found if person.login}
        for person in found:
            if not person.email:
                problems.append(f"{person.login or person.dn} has no {config.email_attribute}: no account")
            elif person.login:
                listed[_external(person)] = person
        accounts = self._accounts()
        ours = list(accounts.values())
        if not listed and any(u.state != DISABLED for u in ours):
            return DirectorySync(
                at=at,
                error=f"the directory listed nobody under {config.base_dn} matching {config.user_filter}; "
                "no one was suspended (check base_dn and user_filter)",
            )
        tally = {"accounts": 0, "suspended": 0, "reinstated": 0, "roles_changed": 0}
        for person in listed.values():
            try:
                kept = await self._keep(person, rules, accounts, "LDAP sync")
            except StoreError as err:
                problems.append(f"{person.login}: {err}")
                continue
            tally["accounts"] += kept.created
            tally["suspended"] += kept.suspended
            tally["reinstated"] += kept.reinstated
            tally["roles_changed"] += kept.role_changed
        for user in ours:
            if user.external_id not in present and user.state != DISABLED:
                row = _row("LDAP sync", user.id, {"state": DISABLED, "why": "gone from the directory"})
                try:
                    await self._people.update(user.id, state=DISABLED, audit=row)
                except StoreError as err:
                    problems.append(f"{user.email}: {err}")
                    continue
                tally["suspended"] += 1
        error = "; ".join(problems)
        return DirectorySync(
            at=at,
            people=len(found),
            error=error if len(error) <= ERROR_MAX else error[:ERROR_MAX] + " …",
            **tally,
        )

    def _accounts(self) -> dict[str, UserRecord]:
        """The directory's accounts by ``external_id``."""
        return {u.external_id: u for u in self._people.users() if u.external_id.startswith(EXTERNAL_PREFIX)}

    async def _keep(self, person: Found, rules: GroupRules, accounts: dict[str, UserRecord], action: str) -> _Kept:
        """Make or update the account of ``person`` as the directory has them; StoreError when it cannot be."""
        external = _external(person)
        user = accounts.get(external)
        if user is None and (same := self._people.user(person.email)) is not None:
            if same.external_id:
                raise InvalidInput(
                    f"{person.email} is the e-mail of an account another provider keeps ({same.external_id})"
                )
            user = same  # an account made before the directory was set up: the directory keeps it from now
        state = DISABLED if person.disabled else "active"
        role = rules.role(person.groups)
        if user is None:
            new_id = new_user_id()
            detail = {"email": person.email, "login": person.login, "state": state, "role": role or ""}
            user = await self._people.create(
                email=person.email,
                name=person.name,
                state=state,
                role=role or "",
                external_id=external,
                id=new_id,
                audit=_row(action, new_id, detail),
            )
            kept = _Kept(user, created=True, suspended=person.disabled, role_changed=bool(role))
        else:
            changes: dict[str, Any] = {
                "email": person.email if user.email != person.email else None,
                "name": person.name if person.name and user.name != person.name else None,
                "state": state if user.state != state else None,
                "role": role if role is not None and user.role != role else None,
                "external_id": external if user.external_id != external else None,
            }
            changes = {field: value for field, value in changes.items() if value is not None}
            if changes:
                user = await self._people.update(user.id, audit=_row(action, user.id, changes), **changes)
            kept = _Kept(
                user,
                suspended="state" in changes and state == DISABLED,
                reinstated="state" in changes and state != DISABLED,
                role_changed="role" in changes,
            )
        await self._place(user, person, rules, action)
        return kept

    async def _place(self, user: UserRecord, person: Found, rules: GroupRules, action: str) -> None:
        """The person's memberships in the mapped places as their groups say; others are left alone."""
        if not rules.targets:
            return
        wanted = rules.places(person.groups)
        # A group is in ``groups`` by its DN and by its name: the names are shown, whatever they grant.
        detail = {"memberships": wanted, "groups": sorted(g for g in person.groups if "=" not in g)}
        await self._people.match_memberships(
            user.id, wanted, targets=rules.targets, by=ACTOR, audit=_row(action, user.id, detail)
        )

    # --- the settings and their state ------------------------------------------------------------

    def _config(self) -> LDAPSettings:
        config = self._settings.current.auth.ldap
        if not config.urls:
            raise DirectoryDown("LDAP sign-in is off: auth.ldap.urls names no directory")
        return config

    async def _service_password(self, config: LDAPSettings) -> str:
        if not config.bind_dn:
            return ""
        try:
            password = await self._secrets.named(config.bind_password)
        except StoreError as err:
            raise self._down(
                config, f"the service account's password ({config.bind_password}) cannot be read: {err}"
            ) from None
        if not password:
            name = config.bind_password.removeprefix("store:auth/")
            raise self._down(
                config,
                f"the service account's password is not stored ({config.bind_password}): "
                f"PUT /api/v1/auth/secrets/{name} keeps it",
            )
        return password

    def _down(self, config: LDAPSettings, reason: str) -> DirectoryDown:
        self._trouble = (config, reason)
        log.warning("LDAP: %s", reason)
        return DirectoryDown(reason)

    def _working(self, config: LDAPSettings) -> None:
        if self._trouble is not None and self._trouble[0] == config:
            self._trouble = None

    def _off(self, config: LDAPSettings) -> str:
        if not config.urls:
            return "auth.ldap.urls names no directory"
        if self._trouble is not None and self._trouble[0] == config:
            return self._trouble[1]
        return ""

    def _rules(self, config: LDAPSettings) -> GroupRules:
        """``auth.ldap``'s roles and memberships, read against the tenancy tree as it is now."""
        return GroupRules.for_ldap(config, self._tenancy)

    def _parse(self, settings_yaml: str) -> tuple[LDAPSettings | None, str]:
        if not settings_yaml.strip():
            config = self._settings.current.auth.ldap
            if not config.urls:
                return None, "no auth.ldap is in force: send settings, an auth.ldap block as YAML, to try one"
            return config, "the auth.ldap in force"
        body = "auth:\n  ldap:\n" + textwrap.indent(settings_yaml.expandtabs(2), "    ")
        try:
            config = parse_settings(body, check_scope=check_scope).auth.ldap
        except SettingsInvalid as err:
            return None, "; ".join(str(_in_block(p)) for p in err.problems)
        if not config.urls:
            return None, "urls: name the directory's servers (ldap://HOST:389 or ldaps://HOST:636)"
        return config, f"valid: {len(config.urls)} server(s), people under {config.base_dn}"

    async def _off_loop(self, config: LDAPSettings, call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``call`` in a worker thread, bounded: each LDAP step has ``timeout``, the whole a few of them more
        (DirectoryError past that; the thread ends by its own step's timeout)."""
        from opod.access.directory_ldap import DirectoryError

        bound = config.timeout_seconds * (len(config.urls) + 6)
        try:
            return await asyncio.wait_for(run_sync(call, *args, **kwargs), bound)
        except TimeoutError:
            raise DirectoryError(f"the directory did not answer within {bound:g}s") from None


def _external(person: Found) -> str:
    return EXTERNAL_PREFIX + person.login.lower()


def _row(action: str, user_id: str, detail: dict[str, Any]) -> AuditRow:
    return AuditRow(
        actor=ACTOR,
        source=SOURCE_LEADER,
        action=action,
        target=f"user:{user_id}",
        detail=detail_text(detail),
        status=200,
        at=datetime.now(UTC),
    )


def _in_block(problem: Problem) -> Problem:
    """A problem of the wrapped body as the block sent has it: its own lines."""
    return Problem(max(problem.line - 2, 0), problem.field, problem.message)


__all__ = ["ACTOR", "EMPTY", "WRONG", "Directory", "DirectoryDown", "DirectoryRefused", "DirectorySync"]
