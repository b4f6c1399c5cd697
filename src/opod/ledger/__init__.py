"""opod.ledger: usage rows and lifecycle events that are never lost, offered as cursor streams.

``Ledger.begin``/``end``/``event`` journal on the request path; ``Ledger.run`` commits to the
store in batches and enforces retention; ``usage_page``/``events_page`` answer the streams.
"""

from opod.ledger.journal import JournalError
from opod.ledger.ledger import Ledger
from opod.ledger.records import OUTCOMES, UsageTicket
from opod.ledger.retention import Pruned, retention_days
from opod.ledger.streams import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    CursorError,
    parse_after,
    parse_limit,
)

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "OUTCOMES",
    "CursorError",
    "JournalError",
    "Ledger",
    "Pruned",
    "UsageTicket",
    "parse_after",
    "parse_limit",
    "retention_days",
]
