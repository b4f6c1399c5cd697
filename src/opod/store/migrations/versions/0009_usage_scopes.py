"""Usage attributed to the tenancy tree: each row's project, team and org, and its cost in micros.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision. Rows written before it belong to no project and cost nothing.


def upgrade() -> None:
    # Plain ADD COLUMN on both databases: a batch on SQLite would copy the table without its
    # AUTOINCREMENT, and usage ids must never be handed out twice.
    op.add_column("usage", sa.Column("project_id", sa.Text(), nullable=False, server_default=sa.text("''")))
    op.add_column("usage", sa.Column("team_id", sa.Text(), nullable=False, server_default=sa.text("''")))
    op.add_column("usage", sa.Column("org_id", sa.Text(), nullable=False, server_default=sa.text("''")))
    op.add_column("usage", sa.Column("cost_micros", sa.BigInteger(), nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    with op.batch_alter_table("usage", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("cost_micros")
        batch.drop_column("org_id")
        batch.drop_column("team_id")
        batch.drop_column("project_id")
