"""Where guard policies are attached, in memory: a policy on an organization, team, project, person or key.

One table per leader, swapped whole on every change (its writer is the guard service, which also follows what
other leaders of the store change); the gateway reads it on every request and keeps what it resolved per key
until :attr:`AttachmentTable.version` moves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Attachment:
    scope: str
    """What it is attached to: one of :data:`opod.store.schema.GUARD_SCOPES` (org, team, project, user, key)."""
    scope_id: str
    """The ID of the organization, team, project, person or key (``org_…``, ``prj_…``, a key's id)."""
    policy: str
    """A policy's name in the settings' ``guard.policies``."""


class AttachmentTable:
    def __init__(self, attachments: Iterable[Attachment] = ()) -> None:
        self.version = 0
        """Moves on every :meth:`replace`: what was resolved from an older table is stale."""
        self._all: tuple[Attachment, ...] = ()
        self._by_scope: dict[tuple[str, str], tuple[str, ...]] = {}
        self.replace(attachments)

    def replace(self, attachments: Iterable[Attachment]) -> None:
        """The table becomes ``attachments``, whole."""
        kept = tuple(dict.fromkeys(attachments))
        by_scope: dict[tuple[str, str], list[str]] = {}
        for a in kept:
            by_scope.setdefault((a.scope, a.scope_id), []).append(a.policy)
        self._all = kept
        self._by_scope = {where: tuple(names) for where, names in by_scope.items()}
        self.version += 1

    def all(self) -> tuple[Attachment, ...]:
        return self._all

    def policies_for(
        self, *, org: str = "", team: str = "", project: str = "", user: str = "", key: str = ""
    ) -> tuple[str, ...]:
        """The names of the policies attached to any of these (an empty ID is none), widest scope first, each once."""
        names: dict[str, None] = {}
        for scope, scope_id in (("org", org), ("team", team), ("project", project), ("user", user), ("key", key)):
            if scope_id:
                names.update(dict.fromkeys(self._by_scope.get((scope, scope_id), ())))
        return tuple(names)
