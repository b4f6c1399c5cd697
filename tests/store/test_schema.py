"""The migrations build exactly the schema the code describes, on both databases."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, MetaData, Text, inspect

from opod.store import Store
from opod.store.migrate import alembic_config, head
from opod.store.schema import metadata

TABLES = {
    "alembic_version",
    "audit",
    "capacity",
    "client_job_lines",
    "client_jobs",
    "credentials",
    "eval_cases",
    "eval_runs",
    "events",
    "federation_peers",
    "file_chunks",
    "files",
    "guard_attachments",
    "key_terms",
    "keys",
    "memberships",
    "meta",
    "models",
    "nodes",
    "orgs",
    "placements",
    "presets",
    "projects",
    "quotas",
    "request_bodies",
    "scim_group_members",
    "scim_groups",
    "scim_users",
    "secrets",
    "serve_jobs",
    "sessions",
    "settings_versions",
    "signin_failures",
    "teams",
    "update_checks",
    "usage",
    "users",
}


def differences(store: Store, target: MetaData) -> list[object]:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return list(compare_metadata(context, target))


def test_the_migrated_schema_equals_the_metadata(store: Store) -> None:
    assert differences(store, metadata) == []
    assert set(inspect(store.engine).get_table_names()) == TABLES


def test_the_comparison_notices_a_change_without_a_migration(store: Store) -> None:
    changed = MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["nodes"].append_column(Column("gpu_count", Text))
    diff = differences(store, changed)
    assert [(d[0], d[3].name) for d in diff if isinstance(d, tuple)] == [("add_column", "gpu_count")]


def test_migrations_go_down_to_nothing_and_up_again(store: Store) -> None:
    with store.engine.begin() as conn:
        command.downgrade(alembic_config(connection=conn), "base")
    assert set(inspect(store.engine).get_table_names()) <= {"alembic_version"}
    with store.engine.begin() as conn:
        command.upgrade(alembic_config(connection=conn), "head")
        assert MigrationContext.configure(conn).get_current_heads() == (head(),)
    assert differences(store, metadata) == []
