"""Signing people in: local passwords, sign-up, a directory's passwords, single sign-on, and the throttle on failures.

One refusal for a wrong password and for an unknown account (the same words, the same status,
and about the same time: an unknown account's password is checked against a hash of nothing),
so a caller learns nothing of who has an account. An empty password is refused before any check.
Failed sign-ins are counted in the store per account and per client address, in a window of
:attr:`Throttle.window`, so that spreading guesses over several leaders gains nothing; past the
limit the next attempts are refused without a check until the window ends. Every attempt is
audited (``source: web``, the name tried as the actor) by the caller's draft.

A directory (LDAP) and an OpenID provider plug in as :class:`DirectoryPlug` and :class:`OidcPlug`:
password sign-in tries the directory for a name that has no local password here; the provider's
callback hands its person to :meth:`SignIn.complete_oidc`. Passwords are hashed off the event
loop, a few at a time (each takes tens of MiB).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NoReturn, Protocol

from opod.access.people import People
from opod.access.sessions import NewSession, Sessions
from opod.security.passwords import Passwords, password_problem
from opod.settings.holder import SettingsHolder
from opod.store import Store
from opod.store.audit import SOURCE_WEB, AuditDraft
from opod.store.errors import Conflict, Forbidden, InvalidInput
from opod.store.offloop import run_sync
from opod.store.people import UserRecord, new_user_id

log = logging.getLogger("opod.access")

WRONG = "wrong email or password; check both and try again"
"""The one answer to a wrong password and to an unknown account."""


class PasswordDirectory(Protocol):
    """A directory people sign in to with its own passwords (``opod.access.directory.Directory``, LDAP)."""

    def configured(self) -> bool:
        """Whether the settings name a directory."""
        ...

    async def sign_in(self, username: str, password: str) -> UserRecord:
        """The person the directory knows by ``username`` and ``password`` (made or brought up to date here)."""
        ...


class OidcStarted(Protocol):
    @property
    def redirect_url(self) -> str: ...

    @property
    def cookie_value(self) -> str: ...

    @property
    def max_age(self) -> int: ...


class OidcFlow(Protocol):
    """Sign-in through an OpenID provider (``opod.access.oidc.OidcSignIn``)."""

    def configured(self) -> bool: ...

    async def begin(self, return_to: str) -> OidcStarted: ...

    def return_to(self, cookie_value: str) -> str: ...

    async def complete(self, params: Mapping[str, str], cookie_value: str) -> UserRecord: ...


@dataclass(frozen=True, slots=True)
class DirectoryPlug:
    """A directory with the errors it raises: ``refused`` for wrong credentials, ``down`` when unreachable."""

    directory: PasswordDirectory
    refused: type[Exception]
    down: type[Exception]


@dataclass(frozen=True, slots=True)
class OidcPlug:
    """An OpenID flow with the error it raises for a callback it refuses."""

    flow: OidcFlow
    refused: type[Exception]


@dataclass(frozen=True, slots=True)
class Throttle:
    """Failed sign-ins allowed per account and per client address in one window."""

    per_account: int = 5
    per_address: int = 20
    window: timedelta = timedelta(minutes=15)


class WrongCredentials(Exception):
    """A wrong password, or an unknown account: the same refusal (401)."""


class TooManyFailures(Exception):
    """Too many failed sign-ins for this account or address (429); ``retry_after`` seconds until the window ends."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SignInUnavailable(Exception):
    """What signs the person in is not answering (the directory is down): 503."""


class SignIn:
    """The sign-in service, built once by the leader; routes call it, the admin listener asks :attr:`sessions`."""

    def __init__(
        self,
        store: Store,
        people: People,
        settings: SettingsHolder,
        sessions: Sessions,
        *,
        passwords: Passwords | None = None,
        throttle: Throttle = Throttle(),
        directory: DirectoryPlug | None = None,
        oidc: OidcPlug | None = None,
        hashing_at_once: int = 4,
    ) -> None:
        self._store = store
        self._people = people
        self._settings = settings
        self.sessions = sessions
        self._passwords = passwords or Passwords()
        self._throttle = throttle
        self._directory = directory
        self.oidc = oidc
        self._hashing = asyncio.Semaphore(hashing_at_once)

    # --- what the settings say ---------------------------------------------------------------------

    @property
    def signup_open(self) -> bool:
        return self._settings.current.auth.signup_open and not self.passwords_off

    @property
    def base_url(self) -> str:
        return self._settings.current.auth.base_url

    @property
    def passwords_off(self) -> bool:
        return self._settings.current.auth.oidc.no_passwords

    def _directory_on(self) -> bool:
        return self._directory is not None and self._directory.directory.configured()

    # --- signing in --------------------------------------------------------------------------------

    async def sign_in(self, username: str, password: str, *, address: str, audit: AuditDraft) -> NewSession:
        """A session for the person ``username`` (an email, or a directory's name) names, when ``password`` is theirs.

        Raises InvalidInput (empty fields), Forbidden (passwords off, account not active), TooManyFailures,
        WrongCredentials, SignInUnavailable.
        """
        name = username.strip()
        _as_web(audit, name)
        if not name:
            raise InvalidInput("username: empty; send the email (or directory name) you sign in with")
        if not password:
            raise InvalidInput("password: empty; send your password")
        if self.passwords_off and not self._directory_on():
            raise Forbidden("passwords are turned off here (auth.oidc.no_passwords): sign in with single sign-on")
        subjects = [f"account:{name.lower()}", f"address:{address}"]
        await self._check_throttle(subjects)
        person = await run_sync(self._store.user_by_email, name) if "@" in name else None
        stored = await run_sync(self._store.password_hash, person.id) if person is not None else None
        if stored is not None and not self.passwords_off:
            if not await self._verify(stored, password):
                await self._failed(subjects)
            assert person is not None
            if self._passwords.stale(stored):
                await run_sync(self._store.set_password_hash, person.id, await self._hash(password))
        elif self._directory_on():
            person = await self._from_directory(name, password, subjects)
        else:
            await self._verify(None, password)
            await self._failed(subjects)
        assert person is not None
        audit.actor = _actor(person.email)
        if person.state != "active":
            raise Forbidden(f"the account {person.email} is {person.state}; an administrator can make it active")
        await run_sync(self._store.clear_signin_failures, subjects[0])
        return await self.sessions.start(person, address, audit=audit)

    async def sign_up(self, email: str, name: str, password: str, *, address: str, audit: AuditDraft) -> NewSession:
        """A new local account (no role, a member of nothing) and its first session, while ``auth.signup_open``."""
        _as_web(audit, email.strip())
        if not self.signup_open:
            why = "passwords are turned off (auth.oidc.no_passwords)" if self.passwords_off else "sign-up is closed"
            raise Forbidden(f"{why}: an administrator makes accounts here (opod ctl users add)")
        person = await self.create_account(email, name, password, role="", audit=audit)
        return await self.sessions.start(person, address, audit=None)  # the account's row says it all

    async def complete_oidc(
        self, params: Mapping[str, str], cookie_value: str, *, address: str, audit: AuditDraft
    ) -> NewSession:
        """A session for the person an OpenID provider's callback names (``OidcPlug.refused`` → WrongCredentials)."""
        _as_web(audit, "oidc")
        if self.oidc is None:
            raise Forbidden("single sign-on is not configured here (auth.oidc in the settings)")
        try:
            person = await self.oidc.flow.complete(params, cookie_value)
        except self.oidc.refused as err:
            raise WrongCredentials(f"single sign-on refused: {err}") from None
        audit.actor = _actor(person.email)
        if person.state != "active":
            raise Forbidden(f"the account {person.email} is {person.state}; an administrator can make it active")
        return await self.sessions.start(person, address, audit=audit)

    # --- accounts, as an admin makes them ----------------------------------------------------------

    async def create_account(self, email: str, name: str, password: str, *, role: str, audit: AuditDraft) -> UserRecord:
        """A person with a local password, in one transaction with the audit row; Conflict when the email is taken."""
        if not email.strip():
            raise InvalidInput("email: empty; send the address the person signs in with")
        if "@" not in email:
            raise InvalidInput(f"email: {email!r} is not an email address; people sign in with theirs")
        if problem := password_problem(password):
            raise InvalidInput(f"password: {problem}")
        if await run_sync(self._store.user_by_email, email) is not None:
            raise Conflict(f"email: {email.strip()} has an account already; sign in, or reset its password")
        hashed = await self._hash(password)
        user_id = new_user_id()
        with audit.commit(target=f"user:{user_id}", detail={"email": email.strip(), "name": name, "role": role}) as row:
            return await self._people.create(
                email=email.strip(), name=name.strip(), role=role, id=user_id, password_hash=hashed, audit=row
            )

    async def set_password(self, user_id: str, password: str, *, audit: AuditDraft) -> datetime:
        """Set or reset a person's local password; their sessions end (sign in again with the new one)."""
        if problem := password_problem(password):
            raise InvalidInput(f"password: {problem}")
        hashed = await self._hash(password)
        at = datetime.now(UTC)
        with audit.commit(target=f"user:{user_id}", detail={}) as row:
            await run_sync(self._store.set_password_hash, user_id, hashed, at=at, audit=row)
        await self.sessions.end_all(user_id)
        return at

    async def change_account(
        self, user_id: str, *, role: str | None, state: str | None, audit: AuditDraft
    ) -> UserRecord:
        """A person's role or state; one no longer active has their sessions ended at once (on every leader: each
        look-up of a session reads its person's state)."""
        with audit.commit(target=f"user:{user_id}") as row:
            person = await self._people.update(user_id, role=role, state=state, audit=row)
        if person.state != "active":
            await self.sessions.end_all(person.id)
        return person

    # --- inside ------------------------------------------------------------------------------------

    async def _from_directory(self, name: str, password: str, subjects: list[str]) -> UserRecord:
        assert self._directory is not None
        try:
            return await self._directory.directory.sign_in(name, password)
        except self._directory.refused:
            await self._failed(subjects)
        except self._directory.down as err:
            log.warning("sign-in: the directory is down: %s", err)
            raise SignInUnavailable(
                "the directory people sign in with is not answering; try again shortly (the leader's log says why)"
            ) from None

    async def _check_throttle(self, subjects: list[str]) -> None:
        limits = {subjects[0]: self._throttle.per_account, subjects[1]: self._throttle.per_address}
        now = datetime.now(UTC)
        counted = await run_sync(self._store.signin_failures, subjects, now - self._throttle.window)
        for subject, (failures, since) in counted.items():
            if failures >= limits[subject]:
                wait = max(1, int((since + self._throttle.window - now).total_seconds()) + 1)
                what = "this account" if subject.startswith("account:") else "this address"
                raise TooManyFailures(
                    f"too many failed sign-ins for {what}; try again in {wait} s, or ask an administrator to "
                    "reset the password",
                    wait,
                )

    async def _failed(self, subjects: list[str]) -> NoReturn:
        now = datetime.now(UTC)
        await run_sync(self._store.count_signin_failure, subjects, at=now, window_from=now - self._throttle.window)
        raise WrongCredentials(WRONG)

    async def _verify(self, stored: str | None, password: str) -> bool:
        async with self._hashing:
            if stored is None:
                await asyncio.to_thread(self._passwords.verify_nothing, password)
                return False
            return await asyncio.to_thread(self._passwords.verify, stored, password)

    async def _hash(self, password: str) -> str:
        async with self._hashing:
            return await asyncio.to_thread(self._passwords.hash, password)


def _actor(name: str) -> str:
    """The audit's actor for a name someone tried: printable, at most 128 characters."""
    return "".join(c for c in name if c.isprintable())[:128] or "unknown"


def _as_web(audit: AuditDraft, name: str) -> None:
    """A sign-in's audit row: from the web, by the name tried, never with the password."""
    audit.source = SOURCE_WEB
    audit.actor = _actor(name)
    audit.body = {"username": name[:256]} if name else {}


__all__ = [
    "WRONG",
    "DirectoryPlug",
    "OidcFlow",
    "OidcPlug",
    "OidcStarted",
    "PasswordDirectory",
    "SignIn",
    "SignInUnavailable",
    "Throttle",
    "TooManyFailures",
    "WrongCredentials",
]
