"""The store's tables, as SQLAlchemy Core metadata.

Every change here needs an Alembic revision in ``migrations/versions``; a test compares the
migrated database with this metadata on SQLite and PostgreSQL and fails on any difference.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.types import TypeDecorator

# Named constraints, so migrations can address them by name on every database.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

KEY_KINDS = ("admin", "api", "node")
WANTED_STATES = ("loaded", "unloaded")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on both databases.

    SQLite keeps no zone, so values are normalised to UTC on the way in and tagged UTC on the
    way out; PostgreSQL's ``timestamptz`` comes back in the session zone and is converted.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()}: the store keeps timezone-aware times only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


keys = Table(
    "keys",
    metadata,
    Column("id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("hash", Text, nullable=False),
    Column("prefix", Text, nullable=False),
    Column("team", Text, nullable=False),
    Column("admission_class", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
    Column("last_used_at", UTCDateTime, nullable=True),
    Column("node_id", Text, nullable=True),
    UniqueConstraint("hash"),
    CheckConstraint(_one_of("kind", KEY_KINDS), name="kind"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("os", Text, nullable=False),
    Column("arch", Text, nullable=False),
    Column("ram_gb", Double, nullable=False),
    Column("address", Text, nullable=False),
    Column("hardware_json", Text, nullable=False),
    Column("boot_id", Text, nullable=False),
    Column("token_id", Text, nullable=True),
    Column("registered_at", UTCDateTime, nullable=False),
    Column("last_seen_at", UTCDateTime, nullable=False),
    Column("drained", Boolean, nullable=False),
    Column("drained_at", UTCDateTime, nullable=True),
    # 0003: the cordon (no new replicas), operator labels, chosen engine builds, the wanted release
    Column("cordoned", Boolean, nullable=False, server_default=false()),
    Column("operator_labels_json", Text, nullable=False, server_default="{}"),
    Column("engine_builds_json", Text, nullable=False, server_default="{}"),
    Column("wanted_version", Text, nullable=False, server_default=text("''")),
)

models = Table(
    "models",
    metadata,
    Column("id", Text, primary_key=True),
    Column("source_json", Text, nullable=False),
    Column("entry_json", Text, nullable=True),
    Column("engine", Text, nullable=False),
    Column("added_at", UTCDateTime, nullable=False),
    Column("definition_json", Text, nullable=True),  # the whole catalog.Model as the management API took it (0004)
)

capacity = Table(
    "capacity",
    metadata,
    Column("model_id", Text, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
    Column("profile", Text, primary_key=True),
    Column("capacity_json", Text, nullable=False),
    Column("measured_by", Text, nullable=False),
    Column("measured_at", UTCDateTime, nullable=False),
)

presets = Table(
    "presets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("added_by", Text, nullable=False),
    Column("added_at", UTCDateTime, nullable=True),
    Column("declined", Boolean, nullable=False),
)

placements = Table(
    "placements",
    metadata,
    Column("model_id", Text, ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
    Column("node_id", Text, primary_key=True),
    Column("wanted", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint(_one_of("wanted", WANTED_STATES), name="wanted"),
)

meta = Table(
    "meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)
