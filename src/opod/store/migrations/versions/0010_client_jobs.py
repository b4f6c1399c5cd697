"""Client jobs: OpenAI's files and batches, and each batch's lines with their answers.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own
# revision and must not change when the current code does.
UTC_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("owner_key_id", sa.Text(), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("purpose", sa.Text(), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_index("ix_files_owner_key_id", "files", ["owner_key_id"])
    op.create_table(
        "client_jobs",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("owner_key_id", sa.Text(), nullable=False),
        sa.Column("project_id", sa.Text(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("input_file_id", sa.Text(), nullable=False),
        sa.Column("completion_window", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.Column("errors_json", sa.Text(), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=False),
        sa.Column("in_progress_at", UTC_TIME, nullable=True),
        sa.Column("finalizing_at", UTC_TIME, nullable=True),
        sa.Column("completed_at", UTC_TIME, nullable=True),
        sa.Column("failed_at", UTC_TIME, nullable=True),
        sa.Column("expired_at", UTC_TIME, nullable=True),
        sa.Column("cancelling_at", UTC_TIME, nullable=True),
        sa.Column("cancelled_at", UTC_TIME, nullable=True),
        sa.Column("output_file_id", sa.Text(), nullable=True),
        sa.Column("error_file_id", sa.Text(), nullable=True),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("completed", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=False),
        sa.Column("lease_until", UTC_TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_client_jobs"),
    )
    op.create_index("ix_client_jobs_status", "client_jobs", ["status"])
    op.create_table(
        "client_job_lines",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("request_json", sa.Text(), nullable=False),
        sa.Column("response_json", sa.Text(), nullable=True),
        sa.Column("error_json", sa.Text(), nullable=True),
        sa.Column("answered_at", UTC_TIME, nullable=True),
        sa.PrimaryKeyConstraint("job_id", "line", name="pk_client_job_lines"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["client_jobs.id"], name="fk_client_job_lines_job_id_client_jobs", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("job_id", "custom_id", name="uq_client_job_lines_job_id"),
    )


def downgrade() -> None:
    op.drop_table("client_job_lines")
    op.drop_index("ix_client_jobs_status", table_name="client_jobs")
    op.drop_table("client_jobs")
    op.drop_index("ix_files_owner_key_id", table_name="files")
    op.drop_table("files")
