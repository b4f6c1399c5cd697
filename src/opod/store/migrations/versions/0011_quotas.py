"""Capacity quotas: a guarantee and a limit in GPUs, CPU cores and GB of memory per scope.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("guarantee_gpus", sa.BigInteger(), nullable=True),
        sa.Column("guarantee_cpu_cores", sa.BigInteger(), nullable=True),
        sa.Column("guarantee_memory_gb", sa.BigInteger(), nullable=True),
        sa.Column("limit_gpus", sa.BigInteger(), nullable=True),
        sa.Column("limit_cpu_cores", sa.BigInteger(), nullable=True),
        sa.Column("limit_memory_gb", sa.BigInteger(), nullable=True),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.CheckConstraint("kind IN ('org', 'team', 'project')", name="ck_quotas_kind"),
        sa.PrimaryKeyConstraint("scope", name="pk_quotas"),
    )


def downgrade() -> None:
    op.drop_table("quotas")
