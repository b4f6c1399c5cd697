"""Each admin key names the leader whose home holds it, so a leader's start revokes only its own.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Keys stored before this say no leader (''): the first leader whose admin.key holds one claims it.
    with op.batch_alter_table("keys") as batch:
        batch.add_column(sa.Column("leader_id", sa.Text(), nullable=False, server_default=sa.text("''")))


def downgrade() -> None:
    with op.batch_alter_table("keys") as batch:
        batch.drop_column("leader_id")
