"""What SCIM provisioning keeps beside the people: each provisioned person's userName and resource, and the
provider's groups (any name) with their members.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "scim_users",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("user_name_folded", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("user_id", name="pk_scim_users"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_scim_users_user_id_users", ondelete="CASCADE"),
        sa.UniqueConstraint("user_name_folded", name="uq_scim_users_user_name_folded"),
    )
    op.create_table(
        "scim_groups",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("display_name", sa.Text(), nullable=False),
        sa.Column("display_name_folded", sa.Text(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scim_groups"),
        sa.UniqueConstraint("display_name_folded", name="uq_scim_groups_display_name_folded"),
    )
    op.create_table(
        "scim_group_members",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("display", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "user_id", name="pk_scim_group_members"),
        sa.ForeignKeyConstraint(
            ["group_id"], ["scim_groups.id"], name="fk_scim_group_members_group_id_scim_groups", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_scim_group_members_user_id_users", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_scim_group_members_user_id", "scim_group_members", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_scim_group_members_user_id", table_name="scim_group_members")
    op.drop_table("scim_group_members")
    op.drop_table("scim_groups")
    op.drop_table("scim_users")
