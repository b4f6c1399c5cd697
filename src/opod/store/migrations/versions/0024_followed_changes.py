"""PostgreSQL: a commit that changes what the leaders follow notifies them (channel ``opod_followed``).

The followers (``opod.store.following``) read the keys, people, the tenancy tree, quotas, the settings and
whether batches are left; a row changed in one of those tables notifies, at its commit, with the table's schema
and name (a transaction's identical notices are delivered once, however many rows it changed), so a leader counts
the changes to the tables it follows, and neither the ledger's writes nor a statement that changed no row.
SQLite has no notifications: its mark is the held connection's ``data_version`` (``opod.store.commits``).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration describes the schema at its own revision.
FOLLOWED = (
    "keys",
    "users",
    "memberships",
    "orgs",
    "teams",
    "projects",
    "quotas",
    "settings_versions",
    "client_jobs",
)
FUNCTION = "opod_followed_changed"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM pg_notify('opod_followed', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME); RETURN NULL; END $$"
    )
    for table in FOLLOWED:
        op.execute(
            f"CREATE TRIGGER {FUNCTION} AFTER INSERT OR UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in FOLLOWED:
        op.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {table}")
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
