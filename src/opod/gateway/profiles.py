"""The routing a request gets: the policy file's (:func:`routing_policy`), with the fields its key's routing profile
in the cluster settings gives.

``default`` (or none) is the policy's routing as it is. A profile the settings no longer
name routes by ``default`` too, so removing one never refuses a request. Each merged routing
is made once per policy view, settings object and name: the request path only looks it up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from opod.access.keytable import DEFAULT_PROFILE
from opod.fleet.router import RoutingPolicy
from opod.settings.schema import RoutingProfile
from opod.snapshots.policy import PolicyView


def routing_policy(view: PolicyView | None) -> RoutingPolicy:
    """The router's settings from the mounted policy's view; the defaults (load only) without one."""
    if view is None:
        return RoutingPolicy()
    r = view.routing
    return RoutingPolicy(
        kv_weight=r.kv_weight,
        kv_saturation_pct=r.kv_saturation_pct,
        prefix_affinity=r.prefix_affinity,
        prefix_block_weight=r.prefix_block_weight,
        revisions=tuple((x.revision, x.share) for x in r.revisions),
    )


def with_profile(routing: RoutingPolicy, profile: RoutingProfile) -> RoutingPolicy:
    """``routing`` with every field ``profile`` gives in place of its own."""
    given = {name: value for name, value in profile.model_dump().items() if value is not None}
    return replace(routing, **given) if given else routing


class RoutingProfiles:
    """The routing of each profile, over whatever the policy file sets now."""

    def __init__(self, profiles: Callable[[], Mapping[str, RoutingProfile]]) -> None:
        self._profiles = profiles
        """The settings' ``routing_profiles`` in force (the settings object is swapped whole on a change)."""
        self._made: tuple[object, RoutingPolicy | None, dict[str, RoutingPolicy]] = (None, None, {})

    def routing(self, base: RoutingPolicy, name: str) -> RoutingPolicy:
        """The routing of profile ``name`` over ``base`` (the policy's); ``base`` itself for ``default`` or an unknown name."""
        if not name or name == DEFAULT_PROFILE:
            return base
        profiles = self._profiles()
        made_for, made_over, merged = self._made
        if made_for is not profiles or made_over is not base:
            merged = {}
            self._made = (profiles, base, merged)
        found = merged.get(name)
        if found is None:
            profile = profiles.get(name)
            found = merged[name] = base if profile is None else with_profile(base, profile)
        return found
