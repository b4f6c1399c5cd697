"""Alembic environment for opod's store.

At run time ``opod.store.migrate.upgrade`` hands in an open connection inside a locked transaction
(``config.attributes["connection"]``); without one (a developer generating a revision), an engine
is made from ``sqlalchemy.url``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, make_url

from opod.store.engine import make_engine
from opod.store.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite alters a table by copying it; autogenerate then writes batch ops.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def _offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(make_url(config.get_main_option("sqlalchemy.url") or ""))
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    _offline()
else:
    _online()
