"""Tenancy: organizations, teams and projects; whose each API key is and the routing profile it asks for.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "orgs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_orgs"),
        sa.UniqueConstraint("name", name="uq_orgs_name"),
    )
    op.create_table(
        "teams",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("org_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_teams"),
        sa.ForeignKeyConstraint(["org_id"], ["orgs.id"], name="fk_teams_org_id_orgs"),
        sa.UniqueConstraint("org_id", "name", name="uq_teams_org_id"),
    )
    op.create_table(
        "projects",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("team_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("had_key", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name="fk_projects_team_id_teams"),
        sa.UniqueConstraint("team_id", "name", name="uq_projects_team_id"),
    )
    with op.batch_alter_table("keys") as batch:
        batch.add_column(sa.Column("project_id", sa.Text(), nullable=False, server_default=sa.text("''")))
        batch.add_column(sa.Column("user_id", sa.Text(), nullable=False, server_default=sa.text("''")))
        batch.add_column(sa.Column("routing_profile", sa.Text(), nullable=False, server_default=sa.text("''")))


def downgrade() -> None:
    with op.batch_alter_table("keys") as batch:
        batch.drop_column("routing_profile")
        batch.drop_column("user_id")
        batch.drop_column("project_id")
    op.drop_table("projects")
    op.drop_table("teams")
    op.drop_table("orgs")
