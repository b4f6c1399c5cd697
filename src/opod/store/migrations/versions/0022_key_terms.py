"""Key search terms: the words a key listing's search matches the start of, indexed.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from opod.store: a migration describes the schema at its own revision.
SEARCH_TEXT = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
BATCH = 5000


def _terms(key_id: str, name: str, prefix: str) -> set[str]:
    words = {key_id.lower(), prefix.lower(), name.lower(), *name.lower().split()}
    return {w for w in words if w}


def upgrade() -> None:
    terms = op.create_table(
        "key_terms",
        sa.Column("term", SEARCH_TEXT, nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["key_id"], ["keys.id"], name=op.f("fk_key_terms_key_id_keys")),
        sa.PrimaryKeyConstraint("term", "key_id", name=op.f("pk_key_terms")),
    )
    assert terms is not None
    op.create_index("ix_key_terms_key_id", "key_terms", ["key_id", "term"])
    conn = op.get_bind()
    keys = sa.table("keys", sa.column("id", sa.Text()), sa.column("name", sa.Text()), sa.column("prefix", sa.Text()))
    after = ""
    while True:
        rows = conn.execute(
            sa.select(keys.c.id, keys.c.name, keys.c.prefix).where(keys.c.id > after).order_by(keys.c.id).limit(BATCH)
        ).all()
        if not rows:
            break
        found = [{"term": t, "key_id": r.id} for r in rows for t in sorted(_terms(r.id, r.name, r.prefix))]
        conn.execute(terms.insert(), found)
        after = rows[-1].id


def downgrade() -> None:
    op.drop_table("key_terms")
