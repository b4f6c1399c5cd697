"""A file's content in chunks of its own rows (file_chunks), so it is written and read a chunk at a time.

The content kept before moves as it is, one chunk per file (a reader takes chunks of any size).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("file_id", "seq", name="pk_file_chunks"),
        sa.ForeignKeyConstraint(["file_id"], ["files.id"], name="fk_file_chunks_file_id_files", ondelete="CASCADE"),
    )
    op.execute("INSERT INTO file_chunks (file_id, seq, data) SELECT id, 0, content FROM files WHERE bytes > 0")
    # Not in batch mode: SQLite (3.35 and later) drops the column in place, where a batch's copy of the
    # table would drop "files" and, with foreign keys on, every chunk with it.
    op.drop_column("files", "content")


def downgrade() -> None:
    op.add_column("files", sa.Column("content", sa.LargeBinary(), nullable=False, server_default=sa.text("''")))
    conn = op.get_bind()
    for (file_id,) in conn.execute(sa.text("SELECT id FROM files")).all():
        rows = conn.execute(
            sa.text("SELECT data FROM file_chunks WHERE file_id = :id ORDER BY seq"), {"id": file_id}
        ).all()
        conn.execute(
            sa.text("UPDATE files SET content = :content WHERE id = :id"),
            {"content": b"".join(bytes(row.data) for row in rows), "id": file_id},
        )
    op.drop_table("file_chunks")
