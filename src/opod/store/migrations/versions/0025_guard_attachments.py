"""Guard attachments: a guard policy of the settings attached to an organization, team, project, person or key.

The leaders follow this table (``opod.access.guard_service.GuardService.follow``), so on PostgreSQL a change
to it notifies them at its commit as 0024's followed tables do (its trigger, on 0024's function).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own revision.
UTC_TIME = sa.DateTime(timezone=True)
FOLLOWED = ("guard_attachments",)
"""Tables the leaders follow from this revision on, besides 0024's."""
FUNCTION = "opod_followed_changed"
"""0024's trigger function: notifies ``opod_followed`` with the changed table's schema and name."""


def upgrade() -> None:
    op.create_table(
        "guard_attachments",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("scope_id", sa.Text(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.CheckConstraint(
            "scope IN ('org', 'team', 'project', 'user', 'key')", name=op.f("ck_guard_attachments_scope")
        ),
        sa.PrimaryKeyConstraint("scope", "scope_id", "policy", name=op.f("pk_guard_attachments")),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in FOLLOWED:
        op.execute(
            f"CREATE TRIGGER {FUNCTION} AFTER INSERT OR UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )


def downgrade() -> None:
    op.drop_table("guard_attachments")  # its trigger goes with it
