"""The tables a leader's followers read are those whose changes tell the other leaders (migration 0024's triggers).

A follower that read a table without the trigger would miss what another leader changed there on PostgreSQL,
where the store's commit mark counts the notices of the followed tables only.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from sqlalchemy import event

from opod.leader.leader import Leader, LeaderSettings

TABLES_READ = re.compile(r"\b(?:FROM|JOIN)\s+\"?(\w+)\"?", re.IGNORECASE)


async def test_every_table_a_follower_reads_notifies_its_changes(tmp_path: Path) -> None:
    followed = set(importlib.import_module("opod.store.migrations.versions.0024_followed_changes").FOLLOWED)
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
        assert len(ran) == 6, ran
        read = {table for statement in statements for table in TABLES_READ.findall(statement)}
        assert read, statements
        assert read <= followed, f"read by a follower without a trigger that notifies: {sorted(read - followed)}"
    finally:
        await leader.close()
