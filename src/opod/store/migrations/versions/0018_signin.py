"""Sign-in: a person's local password (credentials), the web's sessions, and failed sign-ins counted per subject.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "credentials",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("hash", sa.Text(), nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("user_id", name="pk_credentials"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_credentials_user_id_users", ondelete="CASCADE"),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("seen_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sessions"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_sessions_user_id_users", ondelete="CASCADE"),
    )
    op.create_index("ix_sessions_user_id", "sessions", ["user_id"])
    op.create_table(
        "signin_failures",
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("since", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("subject", name="pk_signin_failures"),
    )


def downgrade() -> None:
    op.drop_table("signin_failures")
    op.drop_index("ix_sessions_user_id", table_name="sessions")
    op.drop_table("sessions")
    op.drop_table("credentials")
