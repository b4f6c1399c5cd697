"""Update checks (update_checks): what the registry was last found to have for each model.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own revision.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "update_checks",
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("checked_at", UTC_TIME, nullable=False),
        sa.Column("info_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("model", name="pk_update_checks"),
    )


def downgrade() -> None:
    op.drop_table("update_checks")
