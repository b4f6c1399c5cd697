"""The policy file (``OPOD_POLICY_FILE``): held whole, read through typed views.

Every zero value means the old behaviour, so before any file (or with an empty
one) :meth:`PolicyFile.view` answers the defaults. A new file is checked beyond
its types (weights, percentages, URLs, timeouts, unique guardrail ids) and then
swapped in as one :class:`PolicyView`; a request that read the old view
finishes under it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from opod.contract.adminapi import GuardrailRule, PolicySnapshot
from opod.snapshots.parsing import (
    decode,
    finite_non_negative,
    header_name,
    header_safe,
    http_url,
    in_range,
)
from opod.snapshots.watch import SnapshotError

log = logging.getLogger("opod.snapshots")

DEFAULT_GUARDRAIL_TIMEOUT_MS = 2000
MAX_GUARDRAIL_TIMEOUT_MS = 60_000
MAX_HOLD_MS = 600_000
"""Ten minutes: a longer admission wait outlives most clients' own timeouts."""


@dataclass(frozen=True, slots=True)
class RevisionShare:
    revision: int
    share: float
    """This plan revision's fraction of traffic, 0..1; the shares of a policy add up to 1."""


@dataclass(frozen=True, slots=True)
class Fallback:
    """Where a request goes when the leader has no capacity: an OpenAI-compatible base URL."""

    url: str
    model: str = ""
    """The model name to ask the fallback for; empty = the client's."""
    key: str = ""
    """Bearer key for the fallback; empty = none."""


@dataclass(frozen=True, slots=True)
class RoutingView:
    kv_weight: float = 0.0
    kv_saturation_pct: int = 0
    """0 = off."""
    prefix_affinity: bool = False
    prefix_block_weight: float = 0.0
    cache_isolation: str = ""
    revisions: tuple[RevisionShare, ...] = ()
    """Empty = no split between plan revisions."""
    fallback: Fallback | None = None


@dataclass(frozen=True, slots=True)
class ClassAdmission:
    name: str
    hold_ms: int = 0
    max_share: float = 0.0
    """0 = no cap."""


@dataclass(frozen=True, slots=True)
class AdmissionView:
    hold_ms: int = 0
    """0 = shed at once."""
    max_held: int = 0
    """0 = the leader's default."""
    classes: Mapping[str, ClassAdmission] = field(default_factory=lambda: MappingProxyType({}))

    def for_class(self, name: str) -> ClassAdmission:
        """The class's own settings, or the policy-wide hold with no share cap."""
        return self.classes.get(name) or ClassAdmission(name, self.hold_ms, 0.0)


@dataclass(frozen=True, slots=True)
class PolicyView:
    snapshot: PolicySnapshot
    revision: str
    routing: RoutingView
    access_log: bool | None
    """None = leave the access log as it is."""
    guardrails: tuple[GuardrailRule, ...]
    """Each rule's ``timeout_ms`` is filled in (default 2000)."""
    max_snapshot_age_sec: int
    admission: AdmissionView
    phases: Mapping[str, tuple[GuardrailRule, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """The guardrails by phase, in the file's order: sorted once here, asked for by every request."""

    def guardrails_for(self, phase: str) -> tuple[GuardrailRule, ...]:
        return self.phases.get(phase, ())


def build_view(snap: PolicySnapshot) -> PolicyView:
    """Check ``snap`` beyond its types and build its view; a bad field raises :class:`SnapshotError` naming it."""
    routing = _routing(snap)
    guardrails = _guardrails(snap)
    age = snap.auth.max_snapshot_age_sec
    if age < 0:
        raise SnapshotError(f"auth.maxSnapshotAgeSec: {age} must be ≥ 0 (0 = keep serving from any snapshot age)")
    phases: dict[str, tuple[GuardrailRule, ...]] = {}
    for rule in guardrails:
        phases[rule.phase] = (*phases.get(rule.phase, ()), rule)
    return PolicyView(
        snap,
        snap.revision,
        routing,
        snap.logging.access_log,
        guardrails,
        age,
        _admission(snap),
        MappingProxyType(phases),
    )


def _routing(snap: PolicySnapshot) -> RoutingView:
    r = snap.routing
    finite_non_negative(r.kv_weight, "routing.kvWeight")
    finite_non_negative(r.prefix_block_weight, "routing.prefixBlockWeight")
    in_range(r.kv_saturation_pct, 0, 100, "routing.kvSaturationPct", " (a percentage; 0 = off)")
    shares: tuple[RevisionShare, ...] = ()
    if r.revisions:
        seen: set[int] = set()
        for i, w in enumerate(r.revisions):
            if w.revision < 0:
                raise SnapshotError(f"routing.revisions[{i}].revision: {w.revision} must be ≥ 0")
            if w.revision in seen:
                raise SnapshotError(f"routing.revisions[{i}].revision: revision {w.revision} is listed twice")
            seen.add(w.revision)
            if w.weight < 0:
                raise SnapshotError(f"routing.revisions[{i}].weight: {w.weight} must be ≥ 0")
        total = sum(w.weight for w in r.revisions)
        if total == 0:
            raise SnapshotError(
                "routing.revisions: every weight is 0; give at least one revision a weight (or leave revisions out)"
            )
        shares = tuple(RevisionShare(w.revision, w.weight / total) for w in r.revisions)
    fallback = None
    if r.fallback_url:
        http_url(r.fallback_url, "routing.fallbackUrl")
        header_safe(r.fallback_key, "routing.fallbackKey")
        fallback = Fallback(r.fallback_url.rstrip("/"), r.fallback_model, r.fallback_key)
    elif r.fallback_model or r.fallback_key:
        which = "routing.fallbackModel" if r.fallback_model else "routing.fallbackKey"
        raise SnapshotError(f"{which} is set but routing.fallbackUrl is empty; give the fallback's base URL")
    return RoutingView(
        r.kv_weight, r.kv_saturation_pct, r.prefix_affinity, r.prefix_block_weight, r.cache_isolation, shares, fallback
    )


def _guardrails(snap: PolicySnapshot) -> tuple[GuardrailRule, ...]:
    rules = []
    ids: dict[str, int] = {}
    for i, g in enumerate(snap.guardrails or []):
        where = f"guardrails[{i}]"
        if not g.id.strip():
            raise SnapshotError(f"{where}.id: empty; give every guardrail an id (it names the guardrail in refusals)")
        if g.id in ids:
            raise SnapshotError(f"{where}.id: {g.id!r} is also guardrails[{ids[g.id]}].id; ids must be unique")
        ids[g.id] = i
        http_url(g.url, f"{where}.url (id {g.id!r})")
        in_range(
            g.timeout_ms, 0, MAX_GUARDRAIL_TIMEOUT_MS, f"{where}.timeoutMs (id {g.id!r})", " ms (0 = the default 2000)"
        )
        header_safe(g.auth_key, f"{where}.authKey (id {g.id!r})")
        for name, value in (g.headers or {}).items():
            header_name(name, f"{where}.headers (id {g.id!r})")
            header_safe(value, f"{where}.headers.{name} (id {g.id!r})")
            if g.auth_key and name.lower() == "authorization":
                raise SnapshotError(f"{where}.headers.{name} (id {g.id!r}): conflicts with authKey; give one of them")
        timeout = g.timeout_ms or DEFAULT_GUARDRAIL_TIMEOUT_MS
        rules.append(g.model_copy(update={"timeout_ms": timeout}))
    return tuple(rules)


def _admission(snap: PolicySnapshot) -> AdmissionView:
    a = snap.admission
    in_range(a.hold_ms, 0, MAX_HOLD_MS, "admission.holdMs", " ms (0 = shed at once)")
    if a.max_held < 0:
        raise SnapshotError(f"admission.maxHeld: {a.max_held} must be ≥ 0 (0 = the leader's default)")
    classes: dict[str, ClassAdmission] = {}
    for i, c in enumerate(a.classes or []):
        where = f"admission.classes[{i}]"
        if c.name in classes:
            raise SnapshotError(f"{where}.name: class {c.name!r} is listed twice")
        in_range(c.hold_ms, 0, MAX_HOLD_MS, f"{where}.holdMs", " ms")
        if not math.isfinite(c.max_share) or not 0 <= c.max_share <= 1:
            raise SnapshotError(f"{where}.maxShare: {c.max_share!r} must be a fraction 0..1 (0 = no cap)")
        classes[c.name] = ClassAdmission(c.name, c.hold_ms, c.max_share)
    return AdmissionView(a.hold_ms, a.max_held, MappingProxyType(classes))


EMPTY_VIEW = build_view(PolicySnapshot())


class PolicyFile:
    """Holds the current policy; pass it to a :class:`~opod.snapshots.watch.FileWatcher`."""

    kind = "policy"

    def __init__(self) -> None:
        self._view = EMPTY_VIEW
        self.applied: PolicyView | None = None
        """The view of the file applied last; ``None`` before any (opod's own defaults hold). Read by every request."""
        self._listeners: list[Callable[[PolicyView], None]] = []

    @property
    def revision(self) -> str | None:
        return self._view.revision if self.applied is not None else None

    def current(self) -> PolicySnapshot:
        """The policy in force (an empty one before any file: the old behaviour)."""
        return self._view.snapshot

    def view(self) -> PolicyView:
        """The same policy, typed for readers: read it once per request and use that object throughout."""
        return self._view

    def subscribe(self, listener: Callable[[PolicyView], None]) -> None:
        """Call ``listener`` with each newly applied view (and once now with the current one)."""
        self._listeners.append(listener)
        listener(self._view)

    def parse(self, data: bytes) -> PolicyView:
        return build_view(decode(PolicySnapshot, data, "policy file"))

    def apply(self, view: PolicyView) -> dict[str, Any]:
        self._view = view
        self.applied = view
        for listener in self._listeners:
            try:
                listener(view)
            except Exception:  # one reader's bug must not undo the swap for the others
                log.exception("a policy listener failed")
        return {
            "revision": view.revision,
            "guardrails": [g.id for g in view.guardrails],
            "fallback": view.routing.fallback.url if view.routing.fallback else "",
            "max_snapshot_age_sec": view.max_snapshot_age_sec,
            "access_log": view.access_log,
        }
