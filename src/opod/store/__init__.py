"""opod.store: the leader's durable state (keys, nodes, models, placements, meta, usage rows and events).

SQLAlchemy 2 over SQLite (the embedded default, ``~/.opod/opod.db``) or PostgreSQL (several leaders
sharing one store), with Alembic migrations run at open.
"""

from opod.store.audit import AuditRecord, AuditRow
from opod.store.capacity import CapacityRecord
from opod.store.errors import Conflict, InvalidInput, NotFound, StoreError
from opod.store.guard_attachments import GuardAttachmentRecord
from opod.store.keys import KeyKind, KeyRecord, hash_secret, new_key_id
from opod.store.models import ModelRecord
from opod.store.nodes import NodeRecord
from opod.store.people import MembershipRecord, UserRecord
from opod.store.placements import ANY_NODE, PlacementRecord, Wanted
from opod.store.presets import PresetRecord
from opod.store.quotas import QuotaAmounts, QuotaRecord
from opod.store.requests import RequestBody
from opod.store.settings import SettingsRecord, StaleBase
from opod.store.store import Store
from opod.store.tenancy import OrgRecord, ProjectRecord, TeamRecord, TenancyTree

__all__ = [
    "MembershipRecord",
    "UserRecord",
    "AuditRecord",
    "OrgRecord",
    "ProjectRecord",
    "TeamRecord",
    "TenancyTree",
    "AuditRow",
    "ANY_NODE",
    "CapacityRecord",
    "PresetRecord",
    "GuardAttachmentRecord",
    "QuotaAmounts",
    "QuotaRecord",
    "RequestBody",
    "SettingsRecord",
    "StaleBase",
    "Conflict",
    "InvalidInput",
    "KeyKind",
    "KeyRecord",
    "ModelRecord",
    "NodeRecord",
    "NotFound",
    "PlacementRecord",
    "Store",
    "StoreError",
    "Wanted",
    "hash_secret",
    "new_key_id",
]
