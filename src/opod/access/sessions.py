"""Web sessions: a random token in a cookie, its SHA-256 in the store, and a CSRF token bound to it.

The store holds every session (:mod:`opod.store.signin`), so any leader answers any page and a
leader keeps nothing per client. A session ends at its absolute end (``auth.session_lifetime``),
after ``auth.session_idle`` unused, at sign-out, and at once when its person is no longer active
(each look-up reads the person's state from the store, so a person disabled on another leader is
refused on this one from their next request). The CSRF token is derived from the session's token
(never stored): a page embeds it, and every change made with the session must send it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from opod.contract.durations import seconds as duration_seconds
from opod.settings.holder import SettingsHolder
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import StoreError
from opod.store.offloop import run_sync
from opod.store.people import UserRecord
from opod.store.signin import SessionRecord

SESSION_COOKIE = "opod_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
"""The form field a page's form carries the CSRF token in."""
TOUCH_EVERY = timedelta(minutes=1)
"""How stale a session's last use may be kept before a request writes it again (a write per request otherwise)."""
PRUNE_EVERY = 600.0
"""Seconds between two sweeps of the sessions that ended by time."""
_ACTOR = re.compile(r"[A-Za-z0-9._@-]{1,64}")
log = logging.getLogger("opod.access")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_for(token: str) -> str:
    """The CSRF token of the session whose cookie holds ``token``: derived, so nothing more is stored."""
    return hmac.new(token.encode(), b"opod csrf", hashlib.sha256).hexdigest()


def actor_of(person: UserRecord) -> str:
    """How the audit names a person: their email, or their ID when the email does not fit an actor's letters."""
    return person.email if _ACTOR.fullmatch(person.email) else person.id


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A request's signed-in person, as a page handler or the admin listener sees them."""

    person: UserRecord
    session_id: str
    """The SHA-256 of the session's token."""
    csrf: str
    """What a change made with this session must send (header ``X-CSRF-Token`` or form field ``csrf_token``)."""
    expires_at: datetime

    @property
    def actor(self) -> str:
        return actor_of(self.person)

    def csrf_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(self.csrf, given or "")


@dataclass(frozen=True, slots=True)
class NewSession:
    """A session just started: ``token`` goes into the cookie (and nowhere else); shown once."""

    token: str
    signed_in: SignedIn
    max_age: int
    """Seconds until the session's absolute end: the cookie's ``Max-Age``."""


class Sessions:
    """Starts, finds and ends sessions; the durations are the settings' (``auth.session_*``) at each call."""

    def __init__(
        self, store: Store, settings: SettingsHolder, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock

    def _durations(self) -> tuple[timedelta, timedelta]:
        auth = self._settings.current.auth
        return (
            timedelta(seconds=duration_seconds(auth.session_lifetime)),
            timedelta(seconds=duration_seconds(auth.session_idle)),
        )

    async def start(self, person: UserRecord, address: str, *, audit: AuditDraft | None) -> NewSession:
        """A new session for ``person``, written with its audit row (and the person's ``last_login_at``); no row
        for ``None`` (a sign-up's account row says it)."""
        lifetime, _ = self._durations()
        token = secrets.token_urlsafe(32)
        now = self._clock()
        record = SessionRecord(
            id=token_hash(token),
            user_id=person.id,
            created_at=now,
            seen_at=now,
            expires_at=now + lifetime,
            address=address[:200],
        )
        if audit is None:
            await run_sync(self._store.create_session, record)
        else:
            with audit.commit(target=f"user:{person.id}") as row:
                await run_sync(self._store.create_session, record, audit=row)
        signed_in = SignedIn(person, record.id, csrf_for(token), record.expires_at)
        return NewSession(token, signed_in, int(lifetime.total_seconds()))

    async def find(self, token: str | None) -> SignedIn | None:
        """The signed-in person of a cookie's token; None when it names no live session of an active person."""
        if not token or len(token) > 200:
            return None
        session_id = token_hash(token)
        found = await run_sync(self._store.find_session, session_id)
        if found is None:
            return None
        record, person = found
        _, idle = self._durations()
        now = self._clock()
        if record.expires_at <= now or record.seen_at + idle <= now:
            await run_sync(self._store.end_session, session_id)
            return None
        if person.state != "active":
            await run_sync(self._store.end_sessions_of, person.id)
            return None
        if now - record.seen_at >= min(TOUCH_EVERY, idle / 4):
            await run_sync(self._store.touch_session, session_id, now)
        return SignedIn(person, session_id, csrf_for(token), record.expires_at)

    async def end(self, signed_in: SignedIn, *, audit: AuditDraft) -> None:
        """Sign-out: the session is gone from the store, on every leader."""
        with audit.commit(target=f"user:{signed_in.person.id}", detail={}) as row:
            await run_sync(self._store.end_session, signed_in.session_id, audit=row)

    async def end_all(self, user_id: str) -> int:
        """End every session of a person (their password was reset, say); how many there were."""
        return await run_sync(self._store.end_sessions_of, user_id)

    async def prune(self) -> int:
        """Remove the sessions that ended (by time); :meth:`run` calls it now and then."""
        _, idle = self._durations()
        return await run_sync(self._store.prune_sessions, self._clock(), idle)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep the ended sessions out of the store every :data:`PRUNE_EVERY` seconds until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PRUNE_EVERY)
                return
            try:
                await self.prune()
            except StoreError as err:
                log.warning("could not sweep the ended sessions: %s", err)


__all__ = [
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "NewSession",
    "Sessions",
    "SignedIn",
    "actor_of",
    "csrf_for",
    "token_hash",
]
