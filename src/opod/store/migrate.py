"""Bringing a database to the newest schema with Alembic, configured in code (no alembic.ini).

Two processes may open one database at once (two leaders on PostgreSQL, ``opod up`` next to an
``opod`` command on SQLite). The whole upgrade runs in one transaction that first takes a lock the
other opener waits on: ``pg_advisory_xact_lock`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite
(both databases have transactional DDL). The second opener then finds the schema at head and does
nothing; a failed upgrade leaves nothing half-applied.

To write a new revision after changing ``schema.py``::

    from alembic import command
    from opod.store.migrate import alembic_config
    command.revision(alembic_config("sqlite:////tmp/x.db"), message="…", autogenerate=True)

(upgrade that database first, so autogenerate compares against the current head).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, text

from opod.store.engine import WRITE_OPTION, mask
from opod.store.errors import StoreError

MIGRATIONS = Path(__file__).parent / "migrations"

# One fixed advisory-lock id for "opod schema upgrade" (a 63-bit number: the bytes of "opodmigr").
ADVISORY_LOCK_ID = int.from_bytes(b"opodmigr", "big") & 0x7FFF_FFFF_FFFF_FFFF


def alembic_config(url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic config pointing at ``migrations/``; env.py uses ``connection`` when given."""
    cfg = Config()
    # ConfigParser interpolation treats % specially.
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    """The newest revision this opod knows."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise StoreError(f"the store's migrations have {len(heads)} heads ({', '.join(heads)}); merge them")
    return heads[0]


def upgrade(engine: Engine) -> None:
    """Run every migration the database lacks, under a lock; raises StoreError when it cannot."""
    with engine.connect() as conn:
        conn.execution_options(**{WRITE_OPTION: True})
        try:
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": ADVISORY_LOCK_ID})
                command.upgrade(alembic_config(connection=conn), "head")
        except CommandError as err:
            # Typically a revision stamped by a newer opod that this one does not know.
            raise StoreError(
                f"cannot migrate the store at {mask(engine.url)}: {err}. "
                "If a newer opod wrote this database, run that version (or newer) instead."
            ) from None
