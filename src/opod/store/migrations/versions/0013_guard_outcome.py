"""What the guardrails did to a request, on its usage row: the deciding action, guardrail, phase and
reason, and the time spent in guardrail webhooks.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Rows written before it say no guardrail was consulted ('' and 0).
TEXTS = ("guard_action", "guard_policy", "guard_rule", "guard_category")


def upgrade() -> None:
    # Plain ADD COLUMN: a batch on SQLite would copy the usage table without its AUTOINCREMENT.
    for name in TEXTS:
        op.add_column("usage", sa.Column(name, sa.Text(), nullable=False, server_default=sa.text("''")))
    op.add_column("usage", sa.Column("guard_ms", sa.BigInteger(), nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    with op.batch_alter_table("usage", table_kwargs={"sqlite_autoincrement": True}) as batch:
        for name in ("guard_ms", *reversed(TEXTS)):
            batch.drop_column(name)
