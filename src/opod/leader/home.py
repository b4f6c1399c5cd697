"""The leader's home (``OPOD_HOME``, ``~/.opod``) is its user's alone: 0700, and 0600 for what holds a secret.

Each file is made private when it is created (the store, the keys, the ledger); a home found looser
at start, made by an older opod or copied without its modes, is narrowed here, with a warning for
each path changed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from opod.security.private import private_dir, tighten
from opod.security.sealing import key_path

log = logging.getLogger("opod.leader")

PRIVATE = ("admin.key", "node-secret", "ledger")
"""What the leader keeps in its home beside the store (opod.db, which the store itself keeps private)
and the secrets key: the admin key, the secret node tokens are derived from, the usage journal."""


def make_private(home: Path) -> None:
    """Create ``home`` 0700 when missing, and take every permission of other users off it and its secrets."""
    private_dir(home)
    paths = [home, key_path(home), *(home / name for name in PRIVATE)]
    ledger = home / "ledger"
    if ledger.is_dir():
        paths += sorted(ledger.iterdir())
    for line in tighten(paths):
        log.warning("%s", line)
