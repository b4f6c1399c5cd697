"""A request's record: its status, served model, queue time, end user, tags and cache hit on the usage
row, an index on request_id, and the bodies kept per the retention settings.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision. Rows written before it say nothing of these (0, '' and NULL).
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Plain ADD COLUMN: a batch on SQLite would copy the usage table without its AUTOINCREMENT.
    op.add_column("usage", sa.Column("status", sa.BigInteger(), nullable=False, server_default=sa.text("0")))
    op.add_column("usage", sa.Column("served_model", sa.Text(), nullable=False, server_default=sa.text("''")))
    op.add_column("usage", sa.Column("queue_ms", sa.BigInteger(), nullable=False, server_default=sa.text("0")))
    op.add_column("usage", sa.Column("end_user", sa.Text(), nullable=False, server_default=sa.text("''")))
    op.add_column("usage", sa.Column("tags_json", sa.Text(), nullable=True))
    op.add_column("usage", sa.Column("cache_hit", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("usage", sa.Column("body_state", sa.Text(), nullable=False, server_default=sa.text("''")))
    op.create_index("ix_usage_request_id", "usage", ["request_id"])
    op.create_table(
        "request_bodies",
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("served_model", sa.Text(), nullable=False),
        sa.Column("status", sa.BigInteger(), nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_request_bodies"),
    )
    op.create_index("ix_request_bodies_expires_at", "request_bodies", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_request_bodies_expires_at", table_name="request_bodies")
    op.drop_table("request_bodies")
    op.drop_index("ix_usage_request_id", table_name="usage")
    with op.batch_alter_table("usage", table_kwargs={"sqlite_autoincrement": True}) as batch:
        for name in ("body_state", "cache_hit", "tags_json", "end_user", "queue_ms", "served_model", "status"):
            batch.drop_column(name)
