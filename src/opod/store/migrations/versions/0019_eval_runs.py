"""Quality runs (eval_runs) and the cases each asked (eval_cases).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("suite", sa.Text(), nullable=False),
        sa.Column("suite_hash", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("at", UTC_TIME, nullable=False),
        sa.Column("took_ms", sa.BigInteger(), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("threshold", sa.Double(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("cases", sa.Integer(), nullable=False),
        sa.Column("below", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("judge", sa.Text(), nullable=False),
        sa.Column("by", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_eval_runs"),
    )
    op.create_index("ix_eval_runs_model", "eval_runs", ["model"])
    op.create_index("ix_eval_runs_at", "eval_runs", ["at"])
    op.create_table(
        "eval_cases",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("case_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("expected", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("score", sa.Double(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("took_ms", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["eval_runs.id"], name="fk_eval_cases_run_id_eval_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_eval_cases"),
    )


def downgrade() -> None:
    op.drop_table("eval_cases")
    op.drop_index("ix_eval_runs_at", table_name="eval_runs")
    op.drop_index("ix_eval_runs_model", table_name="eval_runs")
    op.drop_table("eval_runs")
