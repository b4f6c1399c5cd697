"""The store's tables, as SQLAlchemy Core metadata.

Every change here needs an Alembic revision in ``migrations/versions``; a test compares the
migrated database with this metadata on SQLite and PostgreSQL and fails on any difference.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
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
    # 0006: whose key it is (empty = none) and the routing profile it asks for
    Column("project_id", Text, nullable=False, server_default=text("''")),
    Column("user_id", Text, nullable=False, server_default=text("''")),
    Column("routing_profile", Text, nullable=False, server_default=text("''")),
    # 0014: the leader whose home holds this admin key (empty for other kinds, and for admin keys stored before)
    Column("leader_id", Text, nullable=False, server_default=text("''")),
    UniqueConstraint("hash"),
    CheckConstraint(_one_of("kind", KEY_KINDS), name="kind"),
)

# 0022: what a key listing's search matches the start of, one row per word (see store.keys.search_terms). Byte
# order on PostgreSQL too, whatever the database's locale, so a prefix is one range of the primary key's index.
SEARCH_TEXT = Text().with_variant(Text(collation="C"), "postgresql")
key_terms = Table(
    "key_terms",
    metadata,
    Column("term", SEARCH_TEXT, primary_key=True),
    Column("key_id", Text, ForeignKey("keys.id"), primary_key=True),
    Index("ix_key_terms_key_id", "key_id", "term"),
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

# 0008: the cluster's settings, one row per version; a version is written once and never changed.
settings_versions = Table(
    "settings_versions",
    metadata,
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("body", Text, nullable=False),
    Column("note", Text, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("by", Text, nullable=False),
)

# 0006: the tenancy tree. A project that ever had a key keeps ``had_key``: usage refers to it, so it is only renamed.
orgs = Table(
    "orgs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("name"),
)

teams = Table(
    "teams",
    metadata,
    Column("id", Text, primary_key=True),
    Column("org_id", Text, ForeignKey("orgs.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("org_id", "name"),
)

projects = Table(
    "projects",
    metadata,
    Column("id", Text, primary_key=True),
    Column("team_id", Text, ForeignKey("teams.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("had_key", Boolean, nullable=False, server_default=false()),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("team_id", "name"),
)

# 0007: people (provisioned through SCIM, later through sign-in), where each belongs, and auth secrets.
USER_STATES = ("pending", "active", "disabled")
USER_ROLES = ("", "viewer", "operator", "billing", "admin")
"""A person's part in running the fleet; empty when they only use it."""
MEMBER_ROLES = ("member", "manager")

users = Table(
    "users",
    metadata,
    Column("id", Text, primary_key=True),
    Column("email", Text, nullable=False),
    Column("email_folded", Text, nullable=False),  # the email in lower case: unique, so two spellings are one person
    Column("name", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("external_id", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_login_at", UTCDateTime, nullable=True),
    UniqueConstraint("email_folded"),
    CheckConstraint(_one_of("state", USER_STATES), name="state"),
    CheckConstraint(_one_of("role", USER_ROLES), name="role"),
)

memberships = Table(
    "memberships",
    metadata,
    Column("user_id", Text, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    Column("target", Text, primary_key=True, index=True),  # an org, team or project id
    Column("role", Text, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("by", Text, nullable=False),
    CheckConstraint(_one_of("role", MEMBER_ROLES), name="role"),
)

# 0018: a person's local password, as its argon2id hash (opod.security.passwords); sessions: opod.store.signin.
credentials = Table(
    "credentials",
    metadata,
    Column("user_id", Text, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    Column("hash", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

secrets = Table(
    "secrets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("updated_by", Text, nullable=False),
    # 0015: how ``value`` is sealed: "fernet" (opod.security.sealing), or "" for a secret kept in clear before
    # sealing was, sealed at the next start.
    Column("sealing", Text, nullable=False, server_default=text("''")),
)

# 0011: capacity quotas, one row per scope; a NULL amount is not governed (nothing guaranteed, or nothing limited).
QUOTA_KINDS = ("org", "team", "project")

quotas = Table(
    "quotas",
    metadata,
    Column("scope", Text, primary_key=True),  # the scope as answers name it: team:ID
    Column("kind", Text, nullable=False),
    Column("guarantee_gpus", BigInteger, nullable=True),
    Column("guarantee_cpu_cores", BigInteger, nullable=True),
    Column("guarantee_memory_gb", BigInteger, nullable=True),
    Column("limit_gpus", BigInteger, nullable=True),
    Column("limit_cpu_cores", BigInteger, nullable=True),
    Column("limit_memory_gb", BigInteger, nullable=True),
    Column("updated_by", Text, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint(_one_of("kind", QUOTA_KINDS), name="kind"),
)

# 0025: guard policies attached to an organization, team, project, person or key (``opod.access.guard_service``),
# each by the name the settings' guard.policies give it; an attachment outlives its policy's removal from the settings.
GUARD_SCOPES = ("org", "team", "project", "user", "key")

guard_attachments = Table(
    "guard_attachments",
    metadata,
    Column("scope", Text, primary_key=True),  # one of GUARD_SCOPES
    Column("scope_id", Text, primary_key=True),  # the org's, team's, project's, person's or key's ID
    Column("policy", Text, primary_key=True),
    Column("created_by", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    CheckConstraint(_one_of("scope", GUARD_SCOPES), name="scope"),
)

# 0012: the bodies of requests kept for `GET /requests/{id}/body` and replay, each side capped; deleted when expired.
request_bodies = Table(
    "request_bodies",
    metadata,
    Column("request_id", Text, primary_key=True),
    Column("project_id", Text, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False, index=True),
    Column("path", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("served_model", Text, nullable=False),
    Column("status", BigInteger, nullable=False),
    Column("request", Text, nullable=False),
    Column("response", Text, nullable=False),
    Column("truncated", Boolean, nullable=False),
)

# 0021: other opod clusters whose models this one offers as PEER/MODEL (federation); the key is named, never kept.
federation_peers = Table(
    "federation_peers",
    metadata,
    Column("name", Text, primary_key=True),
    Column("url", Text, nullable=False),
    Column("key_file", Text, nullable=False),
    Column("send_tags", Boolean, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", Text, nullable=False),
)
