"""The directory over LDAP (ldap3): connect, StartTLS, bind and search, each bounded by ``auth.ldap.timeout``.

Every call here blocks; :class:`opod.access.directory.Directory` runs them off the event loop. A
search the server refuses raises :class:`DirectoryError`, never a short answer: a sync reading
"nobody" from a failed search would suspend everyone.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars

from opod.access.group_rules import fold
from opod.settings.schema import LDAPSettings

PAGE = 500
"""Entries asked for per page of a search (Active Directory answers at most 1000)."""


class DirectoryError(Exception):
    """The directory could not be used: no server answered, StartTLS failed, the service bind or a search was
    refused. The message says which server and why."""


class BindRefused(DirectoryError):
    """The server answered a bind, and refused it (invalidCredentials, most often)."""


class NotThisPerson(Exception):
    """No such person, more than one, or the password did not bind: one refusal, whichever it was."""


@dataclass(frozen=True, slots=True)
class Found:
    """A person as the directory has them."""

    dn: str
    login: str
    email: str
    name: str
    disabled: bool
    groups: frozenset[str]
    """The person's groups, each by its name and by its DN, folded to lower case (as :func:`fold` writes them)."""


def _values(entry: dict[str, Any], attribute: str) -> list[str]:
    for name, value in entry.get("attributes", {}).items():
        if name.lower() == attribute.lower():
            items = value if isinstance(value, list) else [value]
            return [
                v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in items if v not in (None, "")
            ]
    return []


def _first(entry: dict[str, Any], attribute: str) -> str:
    found = _values(entry, attribute)
    return found[0] if found else ""


def _tls(config: LDAPSettings) -> ldap3.Tls:
    if config.ca_file and not Path(config.ca_file).is_file():
        raise DirectoryError(f"auth.ldap.ca_file {config.ca_file!r} is not a readable file on this leader")
    return ldap3.Tls(
        validate=ssl.CERT_REQUIRED if config.tls_verify else ssl.CERT_NONE, ca_certs_file=config.ca_file or None
    )


class Link:
    """One connection to the first of the settings' servers that answers, not yet bound."""

    def __init__(self, config: LDAPSettings) -> None:
        """DirectoryError naming each server and why, when none answers."""
        self.config = config
        timeout = max(1, math.ceil(config.timeout_seconds))  # ldap3 packs its socket timeouts as whole seconds
        tls = _tls(config)
        self.passed: list[str] = []
        """The servers before this one, and why each did not answer."""
        for url in config.urls:
            server = ldap3.Server(url, connect_timeout=timeout, tls=tls, get_info=ldap3.NONE)
            connection = ldap3.Connection(
                server, receive_timeout=timeout, read_only=True, raise_exceptions=False, auto_referrals=False
            )
            try:
                connection.open()
            except LDAPException as err:
                self.passed.append(f"{url}: {_why(err)}")
                continue
            self.url, self.connection = url, connection
            return
        raise DirectoryError("no LDAP server answered: " + "; ".join(self.passed))

    def start_tls(self) -> None:
        connection = self.connection
        try:
            started = connection.start_tls()
        except LDAPException as err:
            raise DirectoryError(f"StartTLS with {self.url} failed: {_why(err)}") from err
        if not started:
            raise DirectoryError(f"StartTLS with {self.url} failed: {_result(connection)}")

    def bind(self, dn: str, password: str) -> None:
        """Bind this link as ``dn`` (anonymous when ``dn`` is empty); DirectoryError saying why it was refused."""
        connection = self.connection
        connection.authentication = ldap3.SIMPLE if dn else ldap3.ANONYMOUS
        connection.user, connection.password = (dn, password) if dn else (None, None)
        try:
            bound = connection.bind()
        except LDAPException as err:
            raise DirectoryError(f"binding as {dn or 'anonymous'} on {self.url} failed: {_why(err)}") from err
        if not bound:
            raise BindRefused(f"{self.url} refused the bind as {dn or 'anonymous'}: {_result(connection)}")

    def search(
        self, base: str, query: str, attributes: list[str], *, scope: str = ldap3.SUBTREE
    ) -> list[dict[str, Any]]:
        """Every entry of a search, page by page; DirectoryError when the server refuses it, whole or in part."""
        connection, entries, cookie = self.connection, [], None
        while True:
            try:
                connection.search(
                    base, query, scope, attributes=attributes, paged_size=PAGE, paged_cookie=cookie, time_limit=0
                )
            except LDAPException as err:
                raise DirectoryError(f"searching {base} for {query} on {self.url} failed: {_why(err)}") from err
            result = connection.result or {}
            if result.get("result") != 0:
                raise DirectoryError(f"searching {base} for {query} on {self.url} failed: {_result(connection)}")
            entries += [e for e in connection.response or [] if e.get("type") == "searchResEntry"]
            control = (result.get("controls") or {}).get("1.2.840.113556.1.4.319") or {}
            cookie = (control.get("value") or {}).get("cookie")
            if not cookie:
                return entries

    def close(self) -> None:
        try:
            self.connection.unbind()
        except LDAPException:  # the server went away; nothing is held here any more
            pass


def open_link(config: LDAPSettings) -> Link:
    """A link to the first server that answers, StartTLS'd when the settings ask."""
    link = Link(config)
    if config.start_tls:
        try:
            link.start_tls()
        except DirectoryError:
            link.close()
            raise
    return link


@contextmanager
def service_link(config: LDAPSettings, password: str) -> Iterator[Link]:
    """A link bound as the service account (anonymous without ``bind_dn``)."""
    link = open_link(config)
    try:
        link.bind(config.bind_dn, password)
        yield link
    finally:
        link.close()


def _person(config: LDAPSettings, entry: dict[str, Any], disabled: bool, groups: frozenset[str]) -> Found:
    return Found(
        dn=str(entry.get("dn", "")),
        login=_first(entry, config.login_attribute),
        email=_first(entry, config.email_attribute),
        name=_first(entry, config.name_attribute),
        disabled=disabled,
        groups=groups,
    )


def _person_attributes(config: LDAPSettings) -> list[str]:
    return [config.login_attribute, config.email_attribute, config.name_attribute]


def _group_base(config: LDAPSettings) -> str:
    return config.groups.base_dn or config.base_dn


def _group_keys(config: LDAPSettings, entry: dict[str, Any]) -> set[str]:
    return {fold(str(entry.get("dn", "")))} | {fold(n) for n in _values(entry, config.groups.name_attribute)}


def authenticate(config: LDAPSettings, service_password: str, login: str, password: str) -> Found:
    """The person ``login`` names, checked by binding as them with ``password``; their groups read after.

    NotThisPerson when nobody (or more than one) matches or the bind is refused; DirectoryError when the directory
    cannot be used. The caller refuses an empty password before this is called.
    """
    with service_link(config, service_password) as service:
        query = f"(&{config.user_filter}({config.login_attribute}={escape_filter_chars(login)}))"
        matches = service.search(config.base_dn, query, _person_attributes(config))
        if len(matches) != 1:
            raise NotThisPerson(f"{len(matches)} entries match {query}")
        entry = matches[0]
        dn = str(entry["dn"])
        checking = open_link(config)
        try:
            checking.bind(dn, password)
        except BindRefused as err:
            raise NotThisPerson(str(err)) from err
        finally:
            checking.close()
        disabled = bool(config.disabled_filter) and bool(
            service.search(dn, config.disabled_filter, ["1.1"], scope=ldap3.BASE)
        )
        member = config.groups.member_attribute
        by = f"(|({member}={escape_filter_chars(dn)})({member}={escape_filter_chars(_first(entry, config.login_attribute))}))"
        groups = service.search(_group_base(config), f"(&{config.groups.filter}{by})", [config.groups.name_attribute])
        held = frozenset(key for group in groups for key in _group_keys(config, group))
        return _person(config, entry, disabled, held)


def read_all(config: LDAPSettings, service_password: str) -> list[Found]:
    """Everyone the user filter finds, with whether they are disabled there and their groups."""
    with service_link(config, service_password) as service:
        everyone = service.search(
            config.base_dn, f"(&{config.user_filter}({config.login_attribute}=*))", _person_attributes(config)
        )
        disabled: set[str] = set()
        if config.disabled_filter:
            query = f"(&{config.user_filter}{config.disabled_filter})"
            disabled = {fold(str(e["dn"])) for e in service.search(config.base_dn, query, ["1.1"])}
        member = config.groups.member_attribute
        held: dict[str, set[str]] = {}
        for group in service.search(_group_base(config), config.groups.filter, [config.groups.name_attribute, member]):
            keys = _group_keys(config, group)
            for value in _values(group, member):
                held.setdefault(fold(value), set()).update(keys)
        found = []
        for entry in everyone:
            dn, login = fold(str(entry["dn"])), _first(entry, config.login_attribute)
            groups = frozenset(held.get(dn, set()) | held.get(login.lower(), set()))
            found.append(_person(config, entry, dn in disabled, groups))
        return found


Step = tuple[str, bool, str]
"""One step of trying a directory: (step, ok, what happened)."""


def try_directory(config: LDAPSettings, password: str | None) -> list[Step]:
    """Connect, StartTLS, bind as the service account, find the people and the groups; change nothing.

    Stops at the first step that fails, the steps after it not tried. ``password`` None with a ``bind_dn`` is
    refused at the bind step without binding.
    """
    try:
        link = Link(config)
    except DirectoryError as err:
        return [("connect", False, str(err))]
    skipped = f" ({'; '.join(link.passed)} did not)" if link.passed else ""
    steps: list[Step] = [("connect", True, f"{link.url} answered{skipped}")]
    try:
        steps.append(_start_tls(link))
        if not steps[-1][1]:
            return steps
        steps.append(_service_bind(link, password))
        if not steps[-1][1]:
            return steps
        steps.append(_find_people(link))
        steps.append(_find_groups(link))
        return steps
    finally:
        link.close()


def _start_tls(link: Link) -> Step:
    if not link.config.start_tls:
        clear = link.url.lower().startswith("ldap://")
        return (
            "starttls",
            True,
            "not asked" + (": binds cross the network in clear" if clear else f": {link.url} is TLS"),
        )
    try:
        link.start_tls()
    except DirectoryError as err:
        return "starttls", False, str(err)
    return "starttls", True, f"TLS with {link.url}"


def _service_bind(link: Link, password: str | None) -> Step:
    dn = link.config.bind_dn
    if dn and not password:
        return (
            "service_bind",
            False,
            f"no password for {dn}: send password, or keep it with PUT /api/v1/auth/secrets/ldap-bind "
            f"(the settings name {link.config.bind_password})",
        )
    try:
        link.bind(dn, password or "")
    except DirectoryError as err:
        return "service_bind", False, str(err)
    return "service_bind", True, f"bound as {dn}" if dn else "bound anonymously (no bind_dn)"


def _find_people(link: Link) -> Step:
    config = link.config
    query = f"(&{config.user_filter}({config.login_attribute}=*))"
    try:
        people = link.search(config.base_dn, query, _person_attributes(config))
    except DirectoryError as err:
        return "user_search", False, str(err)
    if not people:
        return "user_search", False, f"nobody under {config.base_dn} matches {query}; check base_dn and user_filter"
    mailless = [e for e in people if not _first(e, config.email_attribute)]
    example = _first(people[0], config.login_attribute)
    detail = f"{len(people)} people under {config.base_dn} match {query}, {example} among them"
    if mailless:
        detail += f"; {len(mailless)} have no {config.email_attribute} and cannot sign in"
    return "user_search", True, detail


def _find_groups(link: Link) -> Step:
    config = link.config
    base = _group_base(config)
    try:
        groups = link.search(base, config.groups.filter, [config.groups.name_attribute])
    except DirectoryError as err:
        return "group_search", False, str(err)
    known = {key for group in groups for key in _group_keys(config, group)}
    named = dict.fromkeys([*config.roles, *(m.group for m in config.memberships)])
    missing = [name for name in named if fold(name) not in known]
    detail = f"{len(groups)} groups under {base} match {config.groups.filter}"
    if missing:
        return "group_search", False, detail + f"; the settings name groups the directory lacks: {', '.join(missing)}"
    return "group_search", True, detail + (f"; every group the settings name is there ({len(named)})" if named else "")


def _why(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.replace("socket connection error while opening: ", "")


def _result(connection: ldap3.Connection) -> str:
    result = connection.result or {}
    said = result.get("message") or ""
    return f"{result.get('description', 'no answer')}" + (f" ({said})" if said else "")


__all__ = [
    "BindRefused",
    "DirectoryError",
    "Found",
    "Link",
    "NotThisPerson",
    "authenticate",
    "fold",
    "open_link",
    "read_all",
    "service_link",
    "try_directory",
]
