"""Nodes: the cordon beside the drain, operator labels, chosen engine builds and the wanted release.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Server defaults so that rows written before this revision read as a ready node with nothing set.
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("cordoned", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("operator_labels_json", sa.Text(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("engine_builds_json", sa.Text(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("wanted_version", sa.Text(), nullable=False, server_default=sa.text("''")))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("wanted_version")
        batch.drop_column("engine_builds_json")
        batch.drop_column("operator_labels_json")
        batch.drop_column("cordoned")
