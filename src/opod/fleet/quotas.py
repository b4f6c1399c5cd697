"""Capacity quotas as placement counts them: what each scope holds, its limit, and the guarantees kept free for others.

Pure, like :mod:`opod.fleet.placement`, which asks :class:`QuotaBook` before it
places a replica. A model counts against its owner's scope and every scope above
it (``owners``: model → its scope first, then the team and org above); a model
without an owner is shared and ungoverned. A scope's *limit* caps what its
models hold; its *guarantee* is kept free for it: a replica of a model outside
the scope may not take what would leave the scope unable to reach its guarantee
from what is free now. Each resource (GPUs, CPU cores, GB of host memory) is
governed on its own; ``None`` is not governed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from opod.fleet.scopes import ScopeTree

RESOURCES = ("gpus", "cpu_cores", "memory_gb")
UNITS = {"gpus": "GPUs", "cpu_cores": "CPU cores", "memory_gb": "GB of memory"}


@dataclass(frozen=True, slots=True)
class Amount:
    """How much of each resource something holds or needs (a replica counts its cores and memory on every node)."""

    gpus: float = 0
    cpu_cores: float = 0
    memory_gb: float = 0

    def plus(self, other: Amount, sign: int = 1) -> Amount:
        return Amount(
            self.gpus + sign * other.gpus,
            self.cpu_cores + sign * other.cpu_cores,
            self.memory_gb + sign * other.memory_gb,
        )

    def get(self, resource: str) -> float:
        return float(getattr(self, resource))


@dataclass(frozen=True, slots=True)
class Bounds:
    """A guarantee or a limit: ``None`` for a resource it does not govern."""

    gpus: int | None = None
    cpu_cores: int | None = None
    memory_gb: int | None = None

    def get(self, resource: str) -> int | None:
        value: int | None = getattr(self, resource)
        return value


@dataclass(frozen=True, slots=True)
class Quota:
    scope: str
    """The scope as answers name it: ``team:ID``."""
    guarantee: Bounds = field(default_factory=Bounds)
    limit: Bounds = field(default_factory=Bounds)
    within: tuple[str, ...] = ()
    """The scopes above it, nearest first (a team's org): nested guarantees are counted once."""
    name: str = ""
    """How people know it (``Acme / ml``), for the reasons placement gives."""

    def label(self) -> str:
        return f"{self.scope} ({self.name})" if self.name and self.name != self.scope else self.scope


def amount_held(gpus: Mapping[str, Sequence[int]], cpu_cores: float, memory_gb: float) -> Amount:
    """What a replica holds: its devices on every node, its cores and memory once per node."""
    nodes = max(len(gpus), 1)
    return Amount(sum(len(d) for d in gpus.values()), cpu_cores * nodes, memory_gb * nodes)


def _whole(value: float) -> str:
    return f"{value:g}"


@dataclass(slots=True)
class QuotaBook:
    """The quotas of one placement pass and what each scope holds; told of each replica placed or released."""

    quotas: Mapping[str, Quota]
    owners: Mapping[str, tuple[str, ...]]
    """model → the scopes it counts against, its own first."""
    holds: dict[str, Amount] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    """model → the scope whose quota refused its last replica (a limit's scope, or the first guarantee kept)."""

    @classmethod
    def of(
        cls, quotas: Iterable[Quota], owners: Mapping[str, Sequence[str]], held: Iterable[tuple[str, Amount]] = ()
    ) -> QuotaBook:
        """The book for ``quotas``, with ``held`` (model, amount) counted against their owners."""
        book = cls(quotas={q.scope: q for q in quotas}, owners={m: tuple(s) for m, s in owners.items() if s})
        for model, amount in held:
            book.take(model, amount)
        return book

    def __bool__(self) -> bool:
        return bool(self.quotas)

    def take(self, model: str, amount: Amount) -> None:
        for scope in self.owners.get(model, ()):
            self.holds[scope] = self.holds.get(scope, Amount()).plus(amount)

    def release(self, model: str, amount: Amount) -> None:
        for scope in self.owners.get(model, ()):
            self.holds[scope] = self.holds.get(scope, Amount()).plus(amount, -1)

    def held_by(self, scope: str) -> Amount:
        return self.holds.get(scope, Amount())

    def refusal(self, model: str, need: Amount, free: Amount | None) -> str:
        """Why one more replica of ``model`` needing ``need`` may not be placed (``quota: …``); ``""`` when it may.

        ``free`` is what is free in the fleet now (``None``: guarantees are not checked).
        """
        if not self.quotas:
            return ""
        mine = self.owners.get(model, ())
        for scope in mine:
            quota = self.quotas.get(scope)
            if quota is None:
                continue
            holds = self.held_by(scope)
            for resource in RESOURCES:
                limit, wants = quota.limit.get(resource), need.get(resource)
                if limit is not None and wants > 0 and holds.get(resource) + wants > limit:
                    self.refused[model] = scope
                    return (
                        f"quota: {quota.label()} holds {_whole(holds.get(resource))} of {limit} {UNITS[resource]} "
                        f"(its limit); this replica needs {_whole(wants)} more"
                    )
        if free is None:
            return ""
        for resource in RESOURCES:
            wants = need.get(resource)
            if wants <= 0:
                continue
            kept, whose = self._kept_free(resource, set(mine))
            if kept and free.get(resource) - wants < kept:
                self.refused[model] = whose[0][0] if whose else ""
                short = "; ".join(text for _, text in whose[:3]) + ("; …" if len(whose) > 3 else "")
                return (
                    f"quota: {short}, so {_whole(kept)} stay free for guarantees; "
                    f"{_whole(free.get(resource))} are free and this replica needs {_whole(wants)}"
                )
        return ""

    def _kept_free(self, resource: str, mine: set[str]) -> tuple[float, list[tuple[str, str]]]:
        """How much of ``resource`` must stay free for scopes other than ``mine``, and whose guarantees those are.

        A scope keeps what it lacks of its guarantee, and at least what the guaranteed scopes
        inside it keep; a scope ``mine`` contains keeps only what its other children keep.
        """
        guaranteed = {s: q for s, q in self.quotas.items() if q.guarantee.get(resource) is not None}
        if not guaranteed:
            return 0.0, []
        parent: dict[str, str] = {}
        for scope, quota in guaranteed.items():
            parent[scope] = next((s for s in quota.within if s in guaranteed), "")
        children: dict[str, list[str]] = {}
        for scope, up in parent.items():
            children.setdefault(up, []).append(scope)
        whose: list[tuple[str, str]] = []

        def keeps(scope: str) -> float:
            inner = sum(keeps(c) for c in sorted(children.get(scope, ())))
            if scope in mine:
                return inner
            quota = guaranteed[scope]
            lacks = max((quota.guarantee.get(resource) or 0) - self.held_by(scope).get(resource), 0.0)
            if lacks > inner:
                whose.append(
                    (
                        scope,
                        f"{quota.label()} holds {_whole(self.held_by(scope).get(resource))} of its guarantee of "
                        f"{quota.guarantee.get(resource)} {UNITS[resource]}",
                    )
                )
            return max(lacks, inner)

        total = sum(keeps(s) for s in sorted(children.get("", ())))
        return total, whose


class QuotaTable:
    """The quotas in force, by scope (``team:ID``): set from the store at start, then by the management API after each
    change is committed; the reconciler reads it every round. Replaced whole on each change: a reader sees the old
    table or the new one."""

    def __init__(self, quotas: Iterable[Quota] = ()) -> None:
        self._quotas: Mapping[str, Quota] = MappingProxyType({q.scope: q for q in quotas})

    def all(self) -> list[Quota]:
        return list(self._quotas.values())

    def get(self, scope: str) -> Quota | None:
        return self._quotas.get(scope)

    def put(self, quota: Quota) -> None:
        self._quotas = MappingProxyType({**self._quotas, quota.scope: quota})

    def remove(self, scope: str) -> None:
        self._quotas = MappingProxyType({s: q for s, q in self._quotas.items() if s != scope})

    def book(self, owners: Mapping[str, str], scopes: ScopeTree | None) -> QuotaBook:
        """A book for one placement pass: ``owners`` (model → its owner as the catalog writes it) read through ``scopes``.

        Without a scope tree an owner counts against the scope of exactly that text, and a quota has no scope above it.
        """
        cache: dict[str, tuple[str, ...]] = {}

        def chain(text: str) -> tuple[str, ...]:
            if text not in cache:
                cache[text] = scopes.chain(text) if scopes is not None else (text,)
            return cache[text]

        quotas = [
            Quota(
                q.scope,
                q.guarantee,
                q.limit,
                within=chain(q.scope)[1:],
                name=(scopes.label(q.scope) if scopes is not None else "") or q.name,
            )
            for q in self._quotas.values()
        ]
        return QuotaBook.of(quotas, {model: chain(owner) for model, owner in owners.items() if owner})
