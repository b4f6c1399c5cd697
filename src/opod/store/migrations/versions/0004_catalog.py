"""The cluster's catalog: each model's whole definition, capacity measurements, and the presets' state.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # Nullable: models added before this revision have no definition; the leader writes one from their entry.
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("definition_json", sa.Text(), nullable=True))
    op.create_table(
        "capacity",
        sa.Column("model_id", sa.Text(), nullable=False),
        sa.Column("profile", sa.Text(), nullable=False),
        sa.Column("capacity_json", sa.Text(), nullable=False),
        sa.Column("measured_by", sa.Text(), nullable=False),
        sa.Column("measured_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("model_id", "profile", name="pk_capacity"),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name="fk_capacity_model_id_models", ondelete="CASCADE"),
    )
    op.create_table(
        "presets",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("added_by", sa.Text(), nullable=False),
        sa.Column("added_at", UTC_TIME, nullable=True),
        sa.Column("declined", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_presets"),
    )


def downgrade() -> None:
    op.drop_table("presets")
    op.drop_table("capacity")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("definition_json")
