"""PostgreSQL: a key's last use alone is no change for the leaders to follow.

A busy leader writes when its keys were last used every few seconds; 0024's trigger on ``keys`` notified each such
update, and every leader then read the keys, people, tenancy tree, quotas and settings again. The trigger now
notifies inserts and deletes as before, and an update that changes anything besides ``last_used_at``. A node's
last heartbeat needs nothing: ``nodes`` is not followed. SQLite has no triggers here: its leader makes these writes
on the connection its commit mark is read on (``opod.store.commits``).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = "opod_followed_changed"
"""0024's trigger function, and the name of its trigger on each followed table."""
UPDATED = f"{FUNCTION}_update"
"""The trigger on ``keys`` for its updates, apart from its inserts' and deletes'."""


def _trigger(name: str, events: str, when: str = "") -> None:
    """A trigger on ``keys`` that notifies through 0024's function, for rows that meet ``when`` (every row without)."""
    condition = f"WHEN ({when}) " if when else ""
    op.execute(f"CREATE TRIGGER {name} AFTER {events} ON keys FOR EACH ROW {condition}EXECUTE FUNCTION {FUNCTION}()")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON keys")
    _trigger(FUNCTION, "INSERT OR DELETE")
    # A row's other columns, as JSON without the last use: equal when only the last use changed.
    _trigger(UPDATED, "UPDATE", "(to_jsonb(OLD) - 'last_used_at') IS DISTINCT FROM (to_jsonb(NEW) - 'last_used_at')")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {UPDATED} ON keys")
    op.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON keys")
    _trigger(FUNCTION, "INSERT OR UPDATE OR DELETE")
