"""People: who uses the fleet, where each belongs (memberships), and the auth secrets the settings name.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("email_folded", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("last_login_at", UTC_TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("email_folded", name="uq_users_email_folded"),
        sa.CheckConstraint("state IN ('pending', 'active', 'disabled')", name="ck_users_state"),
        sa.CheckConstraint("role IN ('', 'viewer', 'operator', 'billing', 'admin')", name="ck_users_role"),
    )
    op.create_table(
        "memberships",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("at", UTC_TIME, nullable=False),
        sa.Column("by", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "target", name="pk_memberships"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_memberships_user_id_users", ondelete="CASCADE"),
        sa.CheckConstraint("role IN ('member', 'manager')", name="ck_memberships_role"),
    )
    op.create_index("ix_memberships_target", "memberships", ["target"])
    op.create_table(
        "secrets",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_secrets"),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    op.drop_index("ix_memberships_target", table_name="memberships")
    op.drop_table("memberships")
    op.drop_table("users")
