"""The one writer of guard attachments: a policy of the settings' ``guard.policies`` attached to an organization,
team, project, person or key (``/api/v1/guard``).

A target is written as every area writes scopes (:mod:`opod.access.scopes`: ``org:NAME``, ``team:ORG/TEAM``,
``project:ORG/TEAM/PROJECT`` or the ID after the colon, ``user:ID|EMAIL``, ``key:ID``) and kept by ID. Each change
is written to the store with its audit row, then to the leader's
:class:`~opod.access.guard_attachments.AttachmentTable`, which the gateway reads per request; attachments made or
taken off on another leader of the same store reach this leader's table through :meth:`GuardService.follow`
(the small table read whole when the store changed, ``opod.store.following``).

A policy is attached only while the settings have it. Taken out of the settings later, its attachments stay:
``GET /api/v1/guard`` still lists them (so an operator sees what to detach, or that putting the policy back
brings them back), and the gateway ignores a name the settings do not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from opod.access.guard_attachments import Attachment, AttachmentTable
from opod.access.keys import KeyService
from opod.access.scopes import KINDS, Scope, parse_scope
from opod.access.tenancy import Tenancy
from opod.settings.guard import GuardSettings
from opod.settings.holder import SettingsHolder
from opod.store import GuardAttachmentRecord, Store
from opod.store.audit import AuditDraft
from opod.store.errors import InvalidInput, NotFound
from opod.store.following import StaleRead
from opod.store.offloop import run_sync
from opod.store.usage import GuardCount, UsageRecord

EVENTS_SHOWN = 100
"""The newest requests ``GET /api/v1/guard/events`` lists; its counts cover every one since the time asked."""


@dataclass(frozen=True, slots=True)
class AttachmentStanding:
    """An attachment as the operator reads it: with the name people know its scope by."""

    attachment: Attachment
    name: str
    """``acme``, ``acme/ml``, ``acme/ml/chat``, a person's email, a key's name; ``""`` for one not known (gone)."""


@dataclass(frozen=True, slots=True)
class GuardEvents:
    """What the guards did since a moment: totals, and the newest requests."""

    since: datetime
    counts: list[GuardCount]
    events: list[UsageRecord]


def attachment_of(record: GuardAttachmentRecord) -> Attachment:
    return Attachment(record.scope, record.scope_id, record.policy)


def load_guard_attachments(store: Store) -> AttachmentTable:
    """The leader's table of attachments, from the store (at start-up, off the loop)."""
    return AttachmentTable(attachment_of(r) for r in store.list_guard_attachments())


class GuardService:
    """Attaches and detaches guard policies: the store with its audit row, then the table the gateway reads."""

    def __init__(
        self, store: Store, table: AttachmentTable, *, tenancy: Tenancy, keys: KeyService, settings: SettingsHolder
    ) -> None:
        """``table`` is the one the gateway reads (:func:`load_guard_attachments`)."""
        self.store = store
        self.table = table
        self.tenancy = tenancy
        self.keys = keys
        self.settings = settings

    # --- reading ---------------------------------------------------------------------------------

    @property
    def library(self) -> GuardSettings:
        """The settings' guard section in force here: whether it is on, the policies, the default ones."""
        return self.settings.current.guard

    def standings(self) -> list[AttachmentStanding]:
        """Every attachment, in the order they were made, each with its scope's name; those of a policy the settings
        no longer have included (the gateway ignores them)."""
        key_names = self._key_names()
        return [AttachmentStanding(a, self._name(a, key_names)) for a in self.table.all()]

    def project_name(self, project_id: str) -> str:
        """``org/team/project`` of a project ID; the ID when the project is not known; ``""`` for none."""
        return self.tenancy.path(project_id) or project_id

    async def events(self, since: datetime, limit: int = EVENTS_SHOWN) -> GuardEvents:
        """What the guards did since ``since``, read from the requests' records: counts per project, action, policy
        and category (``allow`` too), and the newest ``limit`` requests they blocked, rewrote or flagged."""
        counts = await run_sync(self.store.guard_counts, since)
        events = await run_sync(self.store.guard_events, since, limit)
        return GuardEvents(since, counts, events)

    # --- changing ----------------------------------------------------------------------------------

    async def attach(self, target: str | None, policy: str | None, audit: AuditDraft) -> Attachment:
        """Attach the settings' policy ``policy`` to what ``target`` names; what is attached already is answered as
        it is. ``InvalidInput`` for a policy the settings do not have or a target that is not written as one,
        ``NotFound`` for a target that names nothing."""
        name = self._policy_name(policy)
        if self.library.policy(name) is None:
            known = ", ".join(p.name for p in self.library.policies) or "none yet"
            raise InvalidInput(
                f"policy: {name!r} is not a policy of the settings' guard.policies ({known}); "
                "name one of them, or add it to guard.policies with PUT /api/v1/settings first"
            )
        scope = await self._existing(target)
        with audit.commit(target=scope.text, detail={"target": target, "policy": name}) as row:
            record, added = await run_sync(
                self.store.add_guard_attachment, scope.kind, scope.id, name, by=audit.actor, audit=row
            )
        attachment = attachment_of(record)
        if added:
            self.table.replace((*self.table.all(), attachment))
        return attachment

    async def detach(self, target: str | None, policy: str | None, audit: AuditDraft) -> Attachment:
        """Take ``policy`` off what ``target`` names (a policy the settings no longer have too; a scope that is gone
        by its ID); ``NotFound`` when it is not attached there."""
        name = self._policy_name(policy)
        scope = self._scope(target)
        with audit.commit(target=scope.text, detail={"target": target, "policy": name}) as row:
            try:
                record = await run_sync(self.store.remove_guard_attachment, scope.kind, scope.id, name, audit=row)
            except NotFound:
                raise NotFound(
                    f"policy {name!r} is not attached to {target!r} ({scope.text}); "
                    "GET /api/v1/guard lists the attachments"
                ) from None
        removed = attachment_of(record)
        self.table.replace(a for a in self.table.all() if a != removed)
        return removed

    # --- other leaders' changes --------------------------------------------------------------

    async def follow(self) -> bool:
        """Read every attachment and swap the table when it differs; True when it did. The leader's
        :class:`~opod.store.following.Following` calls it when the store changed: attachments made on another leader
        are in force here within 2 s.

        Raises :class:`~opod.store.following.StaleRead` when a change made here overlapped the read, which may
        be older than it: the read is dropped and made again at the next look."""
        before = self.table.version
        wanted = tuple(dict.fromkeys(map(attachment_of, await run_sync(self.store.list_guard_attachments))))
        if self.table.version != before:
            raise StaleRead("a guard attachment changed here during the read")
        if wanted == self.table.all():
            return False
        self.table.replace(wanted)
        return True

    # --- the rules -----------------------------------------------------------------------------------

    @staticmethod
    def _policy_name(policy: str | None) -> str:
        name = (policy or "").strip()
        if not name:
            raise InvalidInput("policy: give the name of a policy of the settings' guard.policies (GET /api/v1/guard)")
        return name

    def _scope(self, target: str | None) -> Scope:
        """What ``target`` names, by ID; a target written by ID that names nothing known any more is taken as written
        (an attachment outlives the scope it was on)."""
        try:
            return self.tenancy.resolve(target or "", kinds=KINDS, field="target")
        except NotFound:
            ref = parse_scope(target or "", kinds=KINDS, field="target")
            if not ref.by_id:
                raise
            return Scope(ref.kind, ref.id)

    async def _existing(self, target: str | None) -> Scope:
        """What ``target`` names, which must exist: a key too (the tenancy tree takes a key's ID as written)."""
        scope = self.tenancy.resolve(target or "", kinds=KINDS, field="target")
        if scope.kind == "key":
            try:
                await self.keys.find("api", scope.id)
            except NotFound:
                raise NotFound(
                    f"target: no API key {scope.id!r}; GET /api/v1/keys lists them (key:ID, as ids are listed)"
                ) from None
        return scope

    def _key_names(self) -> dict[str, str]:
        table = self.keys.access.keys
        names = {e.id: e.name for e in table.local_entries()}
        names.update((f.entry.id, f.entry.name) for f in self.keys.file_keys())
        return names

    def _name(self, attachment: Attachment, key_names: dict[str, str]) -> str:
        if attachment.scope == "key":
            return key_names.get(attachment.scope_id, "")
        scope = Scope(attachment.scope, attachment.scope_id)  # type: ignore[arg-type]
        return "/".join(self.tenancy.names(scope))


__all__ = ["EVENTS_SHOWN", "AttachmentStanding", "GuardEvents", "GuardService", "load_guard_attachments"]
