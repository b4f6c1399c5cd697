"""The tables a leader's followers read are those whose changes tell the other leaders (the triggers of migration
0024 and of each later one that names a ``FOLLOWED`` table).

A follower that read a table without the trigger would miss what another leader changed there on PostgreSQL,
where the store's commit mark counts the notices of the followed tables only.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from sqlalchemy import event

from opod.leader.leader import Leader, LeaderSettings
from opod.store.migrate import MIGRATIONS

TABLES_READ = re.compile(r"\b(?:FROM|JOIN)\s+\"?(\w+)\"?", re.IGNORECASE)


def followed_tables() -> set[str]:
    """Every table a migration gave a trigger that notifies the leaders (its ``FOLLOWED``)."""
    tables: set[str] = set()
    for path in sorted((MIGRATIONS / "versions").glob("[0-9]*.py")):
        module = importlib.import_module(f"opod.store.migrations.versions.{path.stem}")
        tables.update(getattr(module, "FOLLOWED", ()))
    return tables


async def test_every_table_a_follower_reads_notifies_its_changes(tmp_path: Path) -> None:
    followed = followed_tables()
    assert {"quotas", "guard_attachments"} <= followed, followed
    leader = Leader.open(LeaderSettings(home=tmp_path, default_models=False))
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    try:
        following = leader.following()
        event.listen(leader.store.engine, "before_cursor_execute", seen)
        try:
            ran = await following.look()  # the first look runs every follower
        finally:
            event.remove(leader.store.engine, "before_cursor_execute", seen)
        assert len(ran) == 7, ran
        read = {table for statement in statements for table in TABLES_READ.findall(statement)}
        assert read, statements
        assert read <= followed, f"read by a follower without a trigger that notifies: {sorted(read - followed)}"
    finally:
        await leader.close()
