"""Sign-in's state: local passwords (``credentials``), sessions (``sessions``) and failed sign-ins (``signin_failures``).

All three are in the store, so every leader of a store serves every page and counts every failure:
a session is good on any leader, and spreading guesses over several leaders gains nothing. A
session row holds the SHA-256 of its token, never the token; a password row its argon2id hash.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import Column, ForeignKey, Index, Integer, Table, Text, case, delete, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from opod.store.audit import AuditRow, insert_audit
from opod.store.base import Repository, text_arg, when
from opod.store.errors import NotFound
from opod.store.people import UserRecord
from opod.store.schema import UTCDateTime, credentials, metadata, users

# 0018: the sessions of the web, and failed sign-ins by account and address (passwords: schema.credentials).
sessions = Table(
    "sessions",
    metadata,
    Column("id", Text, primary_key=True),  # the SHA-256 of the cookie's token, in hex
    Column("user_id", Text, ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("seen_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("address", Text, nullable=False),
    Index("ix_sessions_user_id", "user_id"),
)

signin_failures = Table(
    "signin_failures",
    metadata,
    Column("subject", Text, primary_key=True),  # account:NAME or address:IP
    Column("failures", Integer, nullable=False),
    Column("since", UTCDateTime, nullable=False),  # when the window these failures count in began
)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    """The SHA-256 of the session's token."""
    user_id: str
    created_at: datetime
    seen_at: datetime
    """The last request made with it, to the minute: idle expiry counts from here."""
    expires_at: datetime
    """The absolute end, whatever its use."""
    address: str
    """The client address it was made from."""


class SignInRepo(Repository):
    # --- passwords -----------------------------------------------------------------------------

    def password_hash(self, user_id: str) -> str | None:
        """The person's password hash; None when they have no local password."""
        with self._read() as conn:
            found = conn.execute(select(credentials.c.hash).where(credentials.c.user_id == user_id)).scalar()
        return None if found is None else str(found)

    def set_password_hash(
        self, user_id: str, hash: str, *, at: datetime | None = None, audit: AuditRow | None = None
    ) -> None:
        """Keep ``hash`` as the person's password, replacing the one before; NotFound for nobody."""
        values = {"hash": text_arg(hash, "password hash"), "updated_at": when(at, "updated_at")}
        with self._write() as conn:
            if conn.execute(select(users.c.id).where(users.c.id == user_id)).first() is None:
                raise NotFound(f"no person {user_id!r}; GET /api/v1/users lists them")
            conn.execute(self._upsert(credentials, {"user_id": user_id, **values}, on=["user_id"], update=values))
            if audit is not None:
                insert_audit(conn, audit)

    # --- sessions ------------------------------------------------------------------------------

    def create_session(self, record: SessionRecord, *, audit: AuditRow | None = None) -> None:
        """A new session, the person's ``last_login_at`` and ``audit``, in one transaction."""
        with self._write() as conn:
            conn.execute(sessions.insert().values(**asdict(record)))
            conn.execute(update(users).where(users.c.id == record.user_id).values(last_login_at=record.created_at))
            if audit is not None:
                insert_audit(conn, audit)

    def find_session(self, id: str) -> tuple[SessionRecord, UserRecord] | None:
        """The session with this token hash and its person, expired or not; None when there is none."""
        with self._read() as conn:
            row = conn.execute(select(sessions).where(sessions.c.id == id)).first()
            if row is None:
                return None
            person = conn.execute(select(users).where(users.c.id == row.user_id)).first()
        if person is None:
            return None
        values = dict(person._mapping)
        values.pop("email_folded")
        return SessionRecord(**row._mapping), UserRecord(**values)

    def touch_session(self, id: str, at: datetime) -> None:
        with self._write() as conn:
            conn.execute(update(sessions).where(sessions.c.id == id).values(seen_at=when(at, "seen_at")))

    def end_session(self, id: str, *, audit: AuditRow | None = None) -> bool:
        """Remove the session (sign-out), with ``audit``; False when it was gone already."""
        with self._write() as conn:
            gone = conn.execute(delete(sessions).where(sessions.c.id == id)).rowcount
            if audit is not None:
                insert_audit(conn, audit)
        return bool(gone)

    def end_sessions_of(self, user_id: str) -> int:
        """Remove every session of the person; how many there were."""
        with self._write() as conn:
            return int(conn.execute(delete(sessions).where(sessions.c.user_id == user_id)).rowcount)

    def prune_sessions(self, now: datetime, idle: timedelta) -> int:
        """Remove the sessions past their end or idle longer than ``idle``; how many."""
        with self._write() as conn:
            gone = conn.execute(
                delete(sessions).where(or_(sessions.c.expires_at <= now, sessions.c.seen_at <= now - idle))
            )
            return int(gone.rowcount)

    # --- failed sign-ins -----------------------------------------------------------------------

    def signin_failures(self, subjects: Collection[str], since: datetime) -> dict[str, tuple[int, datetime]]:
        """subject → (failures, when their window began), for those whose window began after ``since``."""
        with self._read() as conn:
            rows = conn.execute(
                select(signin_failures).where(
                    signin_failures.c.subject.in_(list(subjects)), signin_failures.c.since > since
                )
            )
            return {r.subject: (int(r.failures), r.since) for r in rows}

    def count_signin_failure(
        self, subjects: Collection[str], *, at: datetime, window_from: datetime, audit: AuditRow | None = None
    ) -> None:
        """One more failure for each subject, counted in a window that began after ``window_from`` (an older one
        starts again at ``at``), with ``audit``: one transaction, one statement a subject."""
        stamp = when(at, "at")
        table = signin_failures
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        with self._write() as conn:
            for subject in subjects:
                insert = dialect.insert(table).values(subject=text_arg(subject, "subject"), failures=1, since=stamp)
                old = table.c.since <= window_from
                conn.execute(
                    insert.on_conflict_do_update(
                        index_elements=["subject"],
                        set_={
                            "failures": case((old, 1), else_=table.c.failures + 1),
                            "since": case((old, literal(stamp, UTCDateTime)), else_=table.c.since),
                        },
                    )
                )
            if audit is not None:
                insert_audit(conn, audit)

    def clear_signin_failures(self, subject: str) -> None:
        with self._write() as conn:
            conn.execute(delete(signin_failures).where(signin_failures.c.subject == subject))


__all__ = ["SessionRecord", "SignInRepo", "sessions", "signin_failures"]
