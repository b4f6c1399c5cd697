"""The settings in force on one leader: read from the store at start, then the newest version whenever the store changed.

The current ``ClusterSettings`` is swapped whole, never changed in place, so a reader holding
``holder.current`` sees one version from start to end. A leader's own environment may override a
few keys (``local``); those win over the stored body and are named in ``local_keys``. The leader's
:class:`~opod.store.following.Following` calls :meth:`SettingsHolder.follow` when the store has changed, so a
version another leader wrote is in force here within 2 s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from opod.settings.schema import ClusterSettings
from opod.settings.text import SettingsInvalid, parse_settings
from opod.store.offloop import run_sync
from opod.store.settings import SettingsRecord

log = logging.getLogger("opod.settings")


class SettingsSource(Protocol):
    """The store's side the holder reads (``opod.store.Store`` is one)."""

    def settings_newest(self) -> int: ...

    def settings_version(self, version: int | None = None) -> SettingsRecord | None: ...


def with_local(settings: ClusterSettings, local: Mapping[str, Any]) -> ClusterSettings:
    """``settings`` with each dotted key of ``local`` (``prometheus.url``) set to its value, validated again."""
    if not local:
        return settings
    data = settings.model_dump()
    for dotted, value in local.items():
        *parents, last = dotted.split(".")
        place = data
        for part in parents:
            place = place[part]
        place[last] = value
    return ClusterSettings.model_validate(data)


class SettingsHolder:
    def __init__(
        self,
        source: SettingsSource | None = None,
        *,
        local: Mapping[str, Any] | None = None,
    ) -> None:
        """Every default and version 0 until :meth:`load`; with no ``source`` it only holds what it is given."""
        self._source = source
        self._local = dict(local or {})
        with_local(ClusterSettings(), self._local)  # a bad local override fails here, at start, not at the first change
        self.current: ClusterSettings = with_local(ClusterSettings(), self._local)
        """The settings in force, replaced whole by :meth:`apply`, never changed in place (an attribute, not a
        property: several readers look at it on every request)."""
        self._version = 0
        self._skipped = 0  # a newer version that does not validate here: logged once, not every poll
        self._subscribers: list[Callable[[ClusterSettings], None]] = []

    @property
    def version(self) -> int:
        """The version in force; 0 when none was ever written."""
        return self._version

    @property
    def local_keys(self) -> list[str]:
        """The settings keys this leader's own environment overrides, dotted (``prometheus.url``)."""
        return sorted(self._local)

    def subscribe(self, callback: Callable[[ClusterSettings], None]) -> None:
        """Call ``callback(settings)`` after each change of version, on the event loop (keep it quick); a failing
        callback is logged, never fatal."""
        self._subscribers.append(callback)

    def apply(self, version: int, settings: ClusterSettings) -> bool:
        """Put ``version`` in force (local overrides laid on top) unless a newer one is; True when it changed."""
        if version <= self._version:
            return False
        self.current = with_local(settings, self._local)
        self._version = version
        for callback in list(self._subscribers):
            try:
                callback(self.current)
            except Exception:
                log.exception("a settings subscriber failed on version %d", version)
        return True

    def refresh(self) -> bool:
        """Read the newest version from the store and put it in force when it is newer; True when it changed."""
        found = self.fetch()
        return found is not None and self.apply(*found)

    def fetch(self) -> tuple[int, ClusterSettings] | None:
        """The newest stored version when it is newer than the one in force (blocking: the store is read).

        A stored body that no longer validates (written by another opod release) is logged once and
        skipped: the leader keeps the version it has rather than falling back to defaults.
        """
        if self._source is None:
            return None
        newest = self._source.settings_newest()
        if newest <= self._version or newest == self._skipped:
            return None
        record = self._source.settings_version(None)
        if record is None or record.version <= self._version:
            return None
        try:
            return record.version, parse_settings(record.body)
        except SettingsInvalid as err:
            log.error("settings version %d is not in force on this leader: %s", record.version, err)
            self._skipped = record.version
            return None

    load = refresh
    """At start: the newest stored version, or every default when none exists."""

    async def follow(self) -> bool:
        """The newest stored version read off the loop and put in force on it, where subscribers run with the
        leader's other work, when it is newer; True when it changed."""
        found = await run_sync(self.fetch)
        return found is not None and self.apply(*found)
