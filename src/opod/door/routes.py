"""The door's routes file (``DoorRoutes``): model name → leader, applied whole or not at all.

An alias listed more than once goes to its leaders in file order: the first
serves, the next takes over when one cannot be reached or answers 503. A file
that names the same leader twice for an alias, an empty upstream or a bad URL
is refused as a whole, with a message naming the entry, and the door keeps
routing by the last good table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from opod.contract.adminapi import DoorRoute, DoorRoutes
from opod.snapshots.parsing import decode, header_safe, http_url
from opod.snapshots.watch import SnapshotError


@dataclass(frozen=True, slots=True)
class Target:
    """Where one alias goes."""

    alias: str
    base: str
    """The leader's base URL without a trailing ``/`` or ``/v1``; a request path is appended to it."""
    model: str
    """The model name to send upstream (the alias when the route names none)."""
    key: str
    """The key to present upstream; empty = pass the client's own ``Authorization``."""

    @property
    def rewrites_model(self) -> bool:
        return self.model != self.alias


@dataclass(frozen=True, slots=True)
class RouteTable:
    revision: str
    targets: Mapping[str, tuple[Target, ...]]
    """Alias → its leaders, in the order they are tried."""

    def aliases(self) -> list[str]:
        return sorted(self.targets)


def build_table(routes: DoorRoutes) -> RouteTable:
    targets: dict[str, tuple[Target, ...]] = {}
    where: dict[tuple[str, str], int] = {}
    for i, route in enumerate(routes.routes or []):
        target = _target(route, i)
        earlier = where.get((target.alias, target.base))
        if earlier is not None:
            raise SnapshotError(
                f"routes[{i}] (alias {target.alias!r}).upstream: {target.base} already serves this alias "
                f"(routes[{earlier}]); list each leader once per alias"
            )
        where[(target.alias, target.base)] = i
        targets[target.alias] = (*targets.get(target.alias, ()), target)
    return RouteTable(routes.revision, MappingProxyType(targets))


def _target(route: DoorRoute, i: int) -> Target:
    entry = f"routes[{i}]" + (f" (alias {route.alias!r})" if route.alias else "")
    alias = route.alias
    if not alias.strip() or alias != alias.strip():
        raise SnapshotError(f"{entry}.alias: {alias!r} must be a model name without surrounding spaces")
    if not route.upstream.strip():
        raise SnapshotError(f"{entry}.upstream: empty; give the leader's base URL (e.g. http://leader-a:8080)")
    http_url(route.upstream, f"{entry}.upstream")
    parts = urlsplit(route.upstream)
    if parts.query or parts.fragment:
        raise SnapshotError(f"{entry}.upstream: {route.upstream!r} has a query or fragment; give a base URL only")
    base = route.upstream.rstrip("/")
    base = base.removesuffix("/v1")  # a base given with /v1 means the same leader
    if route.model and route.model != route.model.strip():
        raise SnapshotError(f"{entry}.model: {route.model!r} has surrounding spaces")
    header_safe(route.key, f"{entry}.key")
    if route.key != route.key.strip():
        raise SnapshotError(f"{entry}.key: has surrounding spaces")
    return Target(alias, base, route.model or alias, route.key)


class DoorRoutesFile:
    """Holds the door's current table; pass it to a :class:`~opod.snapshots.watch.FileWatcher`."""

    kind = "routes"

    def __init__(self) -> None:
        self._table: RouteTable | None = None

    @property
    def revision(self) -> str | None:
        return self._table.revision if self._table is not None else None

    def table(self) -> RouteTable | None:
        """The table in force; None before any good file."""
        return self._table

    def lookup(self, alias: str) -> tuple[Target, ...]:
        """The alias's leaders in the order to try them; empty for an unknown alias."""
        table = self._table
        return table.targets.get(alias, ()) if table is not None else ()

    def parse(self, data: bytes) -> RouteTable:
        return build_table(decode(DoorRoutes, data, "routes file"))

    def apply(self, table: RouteTable) -> dict[str, Any]:
        self._table = table
        return {"revision": table.revision, "aliases": table.aliases()}
