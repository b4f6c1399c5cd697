"""Serve jobs (serve_jobs): a registry repository fetched, placed, started and tried, kept with its steps.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "serve_jobs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("runner", sa.Text(), nullable=False),
        sa.Column("started_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.Column("job_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_serve_jobs"),
    )
    op.create_index("ix_serve_jobs_started_at", "serve_jobs", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_serve_jobs_started_at", table_name="serve_jobs")
    op.drop_table("serve_jobs")
