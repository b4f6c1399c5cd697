"""API keys and node tokens as the management API issues them: who a key is for, its traits and its lifetime.

A key is a project's, a person's in a project they belong to, or a person's own. Its band is its
admission class; its routing profile one the settings name; its lifetime is bounded by every scope
above it (the cluster settings' ``keys``): asked longer, it is refused; asked for none, it ends where
the shortest bound says. A node token belongs to a machine: no project, person, band or profile.
Every change is written through :class:`~opod.access.service.AccessService` (the store, then the key
table the gateway reads) with its audit row. The keys of the manager's auth file are listed beside
the stored ones, read-only, with their ``k_cp_`` ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from opod.access.keytable import BANDS, DEFAULT_PROFILE, KeyEntry
from opod.access.scopes import Scope
from opod.access.service import AccessService, MintedKind
from opod.access.tenancy import Tenancy
from opod.contract import durations
from opod.security.keys import new_key_id
from opod.settings.holder import SettingsHolder
from opod.store import KeyRecord
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict, Forbidden, InvalidInput, NotFound, StoreError
from opod.store.keys import KeyFilter, KeyPage


def parse_lifetime(text: str | None, field: str = "expires_in") -> timedelta | None:
    """A lifetime such as ``720h``, ``30d`` or ``1h30m``; empty or ``none`` = never expires. ``InvalidInput``
    naming ``field`` otherwise."""
    if text is None or text.strip().lower() in ("", "none", "never"):
        return None
    try:
        seconds = durations.seconds(text)
    except durations.TooLong as err:
        raise InvalidInput(f"{field}: {err}") from None
    except ValueError:
        raise InvalidInput(f"{field}: {text!r} is not a lifetime; write it like 720h, 30d or 1h30m (or none)") from None
    if seconds <= 0:
        raise InvalidInput(f"{field}: a lifetime must be longer than zero")
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class FileKey:
    """A key of the manager's auth file: read-only here, known by its ``k_cp_`` id."""

    entry: KeyEntry
    revoked: bool
    """Revoked in the file, or by a tombstone of its ``revokedKeys``."""
    issued_at: datetime | None
    """The file's ``issuedAt``, else when this leader applied the file."""


@dataclass(frozen=True, slots=True)
class KeyOrder:
    """What a caller asks of a new key (``POST /api/v1/keys``, ``/node-tokens``); every field may be left out."""

    name: str | None = None
    project: str | None = None
    """The project, by ID or path."""
    user: str | None = None
    """The person, by ID or email."""
    band: str | None = None
    routing_profile: str | None = None
    expires_in: str | None = None


class KeyService:
    """Issues, lists and revokes keys by the rules above; the writes go through the access service."""

    def __init__(self, access: AccessService, tenancy: Tenancy, settings: SettingsHolder) -> None:
        self.access = access
        self.tenancy = tenancy
        self.settings = settings

    # --- reads -------------------------------------------------------------------------------------

    def file_keys(self) -> list[FileKey]:
        keys = self.access.keys
        auth = keys.auth
        if auth is None:
            return []
        issued = auth.issued_at or auth.applied_at
        return [FileKey(e, e.revoked or e.id in keys.tombstones, issued) for e in auth.by_hash.values()]

    async def listing(self, kind: MintedKind, project: str | None = None) -> list[KeyRecord | FileKey]:
        """Every key of ``kind`` (API keys: the auth file's too), or those of one project (by ID or path)."""
        if project:
            project_id = self.tenancy.resolve(project, kinds=("project",), field="project").id
            return list(await self.access.list_keys(kind, project_id=project_id))
        stored: list[KeyRecord | FileKey] = list(await self.access.list_keys(kind))
        return stored + list(self.file_keys()) if kind == "api" else stored

    async def page(
        self,
        kind: MintedKind,
        *,
        project: str = "",
        user: str = "",
        search: str = "",
        state: str = "",
        after: str = "",
        before: str = "",
        limit: int = 50,
    ) -> tuple[KeyPage, int]:
        """One page of the stored keys of ``kind`` (one project's, by ID or path, when ``project`` is given) and how
        many the same filter lists: what a console shows of a hundred thousand keys without reading them all.
        ``user`` (a person's ID) keeps that person's keys alone."""
        project_id = self.tenancy.resolve(project, kinds=("project",), field="project").id if project else None
        which = KeyFilter(
            kind=kind,
            project_id=project_id,
            search=search.strip(),
            state=state.strip().lower(),
            user_id=user or None,
        )
        return await self.access.page_keys(which, after=after, before=before, limit=limit)

    async def find(self, kind: MintedKind, key_id: str) -> KeyRecord | FileKey:
        """The key ``key_id`` of ``kind``; ``NotFound`` saying where they are listed."""
        if kind == "api":
            for listed in self.file_keys():
                if listed.entry.id == key_id:
                    return listed
        return await self._stored(kind, key_id)

    # --- changes -----------------------------------------------------------------------------------

    async def create(self, kind: MintedKind, order: KeyOrder, *, audit: AuditDraft) -> tuple[KeyRecord, str]:
        """Mint a key or node token by the rules; returns its record and its secret (shown once, never stored)."""
        if kind == "node" and any((order.project, order.user, order.band, order.routing_profile)):
            raise InvalidInput(
                "project, user, band, routing_profile: a node token belongs to a machine, not a project "
                "or person; leave them out"
            )
        project_id, user_id = self._owner(order)
        band, profile = self._traits(order)
        expires = self._expiry(order.expires_in, project_id, user_id)
        key_id = new_key_id(kind)
        name = order.name or ("node token" if kind == "node" else "api key")
        detail = {
            "name": name,
            "project": project_id,
            "user": user_id,
            "band": band,
            "routing_profile": profile,
            "expires_at": expires.isoformat() if expires else "",
        }
        with audit.commit(target=f"{_target(kind)}:{key_id}", detail=detail) as row:
            record, secret = await self.access.create(
                kind,
                name,
                expires,
                project_id=project_id,
                user_id=user_id,
                band=band,
                routing_profile=profile,
                key_id=key_id,
                audit=row,
            )
        if project_id:  # the store marked it in the same transaction
            self.tenancy.mark_had_key(project_id)
        return record, secret

    async def revoke(self, kind: MintedKind, key_id: str, *, audit: AuditDraft) -> KeyRecord:
        """Refuse the key from the next request on. ``Conflict`` for an auth file's key, ``NotFound`` for none."""
        if kind == "api" and any(k.entry.id == key_id for k in self.file_keys()):
            raise Conflict(
                f"key {key_id} comes from the manager's auth file, which this API does not change; "
                "the manager revokes it (the auth file's revokedKeys)"
            )
        await self._stored(kind, key_id)
        with audit.commit(target=f"{_target(kind)}:{key_id}") as row:
            return await self.access.revoke(key_id, audit=row)

    # --- the rules ---------------------------------------------------------------------------------

    async def _stored(self, kind: MintedKind, key_id: str) -> KeyRecord:
        try:
            record = await self.access.get_key(key_id)
        except NotFound:
            record = None
        if record is None or record.kind != kind:
            raise NotFound(
                f"no {_what(kind)} {key_id!r}; `opod token ls{' --node' if kind == 'node' else ''}` lists them"
            )
        return record

    def _owner(self, order: KeyOrder) -> tuple[str, str]:
        """The project and person a key is for, checked: (project ID, user ID), each ``""`` when not given."""
        tenancy = self.tenancy
        project_id = user_id = ""
        if order.project:
            project_id = tenancy.resolve(order.project, kinds=("project",), field="project").id
        if order.user:
            person = tenancy.user(order.user)
            if person is None:
                raise NotFound(f"user: no person {order.user!r} (by ID or email); GET /api/v1/users lists them")
            user_id = str(person.id)
            if not tenancy.user_active(user_id):
                raise Conflict(f"user: {order.user} is deactivated; reinstate them before issuing them a key")
            if project_id and tenancy.belongs(user_id, project_id) is False:
                raise Forbidden(
                    f"user: {order.user} is not a member of project {tenancy.path(project_id)}; "
                    "add a membership first (POST /api/v1/users/{id}/memberships), or leave project out"
                )
        return project_id, user_id

    def _traits(self, order: KeyOrder) -> tuple[str, str]:
        band, profile = order.band or "", order.routing_profile or ""
        if band and band not in BANDS:
            raise InvalidInput(f"band: {band!r} is not an admission class; use one of {', '.join(BANDS)}")
        known = [DEFAULT_PROFILE, *self.settings.current.routing_profiles]
        if profile and profile not in known:
            raise InvalidInput(
                f"routing_profile: {profile!r} is not a routing profile here; the known ones are {', '.join(known)} "
                "(define more under routing_profiles in the settings)"
            )
        return band, profile

    def _expiry(self, expires_in: str | None, project_id: str, user_id: str) -> datetime | None:
        lifetime = parse_lifetime(expires_in)
        limits = self._lifetime_limits(project_id, user_id)
        if lifetime is not None:
            for scope, limit in limits:
                if lifetime > limit:
                    raise InvalidInput(
                        f"expires_in: {expires_in} is longer than {scope} allows: keys there live at most "
                        f"{_duration(limit)}; ask for {_duration(limit)} or less"
                    )
        elif limits:
            lifetime = min(limit for _, limit in limits)  # "none" still ends where a scope above says keys end
        return datetime.now(UTC) + lifetime if lifetime else None

    def _lifetime_limits(self, project_id: str, user_id: str) -> list[tuple[str, timedelta]]:
        """(scope, longest lifetime) of every scope above the key that limits it, from the cluster settings."""
        rules = self.settings.current.keys
        limits: list[tuple[str, timedelta]] = []
        if rules.max_lifetime:
            limits.append(
                ("the cluster (settings keys.max_lifetime)", timedelta(seconds=durations.seconds(rules.max_lifetime)))
            )
        if not rules.scopes:
            return limits
        tenancy = self.tenancy
        above = {s.text for s in tenancy.ancestors(Scope("project", project_id))} if project_id else set()
        if user_id:
            above.add(Scope("user", user_id).text)
        for text, limit in rules.scopes.items():
            if not limit:
                continue
            try:
                scope = tenancy.resolve(text)
            except StoreError:
                continue  # a scope the settings name that no longer exists limits nothing
            if scope.text in above:
                limits.append(
                    (
                        f"{scope.kind} {tenancy.scope_path(scope)} (settings keys.scopes)",
                        timedelta(seconds=durations.seconds(limit)),
                    )
                )
        return limits


def _target(kind: MintedKind) -> str:
    """How the audit names a key's kind in its targets (``key:ID``, ``node-token:ID``)."""
    return "node-token" if kind == "node" else "key"


def _what(kind: MintedKind) -> str:
    return "node token" if kind == "node" else "API key"


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h" if not rest else f"{seconds}s"


__all__ = ["FileKey", "KeyOrder", "KeyService", "parse_lifetime"]
