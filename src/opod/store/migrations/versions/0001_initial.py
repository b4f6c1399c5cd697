"""The leader's first tables: keys, nodes, models, placements, meta.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store.schema: a migration describes the schema at
# its own revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "keys",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("hash", sa.Text(), nullable=False),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("admission_class", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=True),
        sa.Column("revoked_at", UTC_TIME, nullable=True),
        sa.Column("last_used_at", UTC_TIME, nullable=True),
        sa.Column("node_id", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_keys"),
        sa.UniqueConstraint("hash", name="uq_keys_hash"),
        sa.CheckConstraint("kind IN ('admin', 'api', 'node')", name="ck_keys_kind"),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("os", sa.Text(), nullable=False),
        sa.Column("arch", sa.Text(), nullable=False),
        sa.Column("ram_gb", sa.Double(), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("hardware_json", sa.Text(), nullable=False),
        sa.Column("boot_id", sa.Text(), nullable=False),
        sa.Column("token_id", sa.Text(), nullable=True),
        sa.Column("registered_at", UTC_TIME, nullable=False),
        sa.Column("last_seen_at", UTC_TIME, nullable=False),
        sa.Column("drained", sa.Boolean(), nullable=False),
        sa.Column("drained_at", UTC_TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("source_json", sa.Text(), nullable=False),
        sa.Column("entry_json", sa.Text(), nullable=True),
        sa.Column("engine", sa.Text(), nullable=False),
        sa.Column("added_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
    )
    op.create_table(
        "placements",
        sa.Column("model_id", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("wanted", sa.Text(), nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("model_id", "node_id", name="pk_placements"),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name="fk_placements_model_id_models", ondelete="CASCADE"),
        sa.CheckConstraint("wanted IN ('loaded', 'unloaded')", name="ck_placements_wanted"),
    )
    op.create_table(
        "meta",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_meta"),
    )


def downgrade() -> None:
    for table in ("placements", "models", "nodes", "keys", "meta"):
        op.drop_table(table)
