"""Each secret says how its value is sealed; those kept before are clear ('') until a leader with the key seals them.

Sealing needs the key in the leader's home, which a migration does not have: ``Store.open`` seals the
clear ones when it is given the key (``SecretsRepo.adopt_secrets_key``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("secrets") as batch:
        batch.add_column(sa.Column("sealing", sa.Text(), nullable=False, server_default=sa.text("''")))


def downgrade() -> None:
    # A sealed value means nothing to the opod before this one: drop it rather than hand out ciphertext as a secret.
    op.execute("DELETE FROM secrets WHERE sealing <> ''")
    with op.batch_alter_table("secrets") as batch:
        batch.drop_column("sealing")
