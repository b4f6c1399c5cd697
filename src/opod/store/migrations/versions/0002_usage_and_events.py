"""The ledger's tables: usage rows and lifecycle events, each with its own cursor ids.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def _cursor_id() -> sa.Column[int]:
    # BIGSERIAL on PostgreSQL; INTEGER PRIMARY KEY AUTOINCREMENT on SQLite (ids never reused).
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False)


def upgrade() -> None:
    op.create_table(
        "usage",
        _cursor_id(),
        sa.Column("entry", sa.Text(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("ts", UTC_TIME, nullable=False),
        sa.Column("api_key_id", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("protocol", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms", sa.BigInteger(), nullable=False),
        sa.Column("ttft_ms", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("route_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_usage"),
        sa.UniqueConstraint("entry", name="uq_usage_entry"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_usage_ts", "usage", ["ts"])
    op.create_table(
        "events",
        _cursor_id(),
        sa.Column("entry", sa.Text(), nullable=False),
        sa.Column("ts", UTC_TIME, nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.UniqueConstraint("entry", name="uq_events_entry"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_ts", "events", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_events_ts", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_usage_ts", table_name="usage")
    op.drop_table("usage")
