"""A key's routing profile: the policy's routing with the profile's fields over it, made once per settings object."""

from __future__ import annotations

import pytest

from opod.fleet.router import RoutingPolicy
from opod.gateway.profiles import RoutingProfiles, with_profile
from opod.settings.schema import ClusterSettings, RoutingProfile
from opod.settings.text import SettingsInvalid, parse_settings

POLICY = RoutingPolicy(
    kv_weight=1.0, kv_saturation_pct=80, prefix_affinity=False, prefix_block_weight=0.5, revisions=((2, 1.0),)
)


def test_a_profile_replaces_only_the_fields_it_gives() -> None:
    merged = with_profile(POLICY, RoutingProfile(prefix_affinity=True, kv_weight=0.0))
    assert merged == RoutingPolicy(
        kv_weight=0.0, kv_saturation_pct=80, prefix_affinity=True, prefix_block_weight=0.5, revisions=((2, 1.0),)
    )
    assert with_profile(POLICY, RoutingProfile()) is POLICY


def test_default_and_unknown_profiles_route_by_the_policy() -> None:
    settings = ClusterSettings(routing_profiles={"sticky": RoutingProfile(prefix_affinity=True)})
    profiles = RoutingProfiles(lambda: settings.routing_profiles)
    assert profiles.routing(POLICY, "") is POLICY
    assert profiles.routing(POLICY, "default") is POLICY
    assert profiles.routing(POLICY, "removed-since") is POLICY
    assert profiles.routing(POLICY, "sticky").prefix_affinity is True


def test_the_merged_routing_follows_the_settings_and_the_policy() -> None:
    current = [ClusterSettings(routing_profiles={"p": RoutingProfile(kv_weight=2.0)})]
    profiles = RoutingProfiles(lambda: current[0].routing_profiles)
    first = profiles.routing(POLICY, "p")
    assert profiles.routing(POLICY, "p") is first  # looked up, not made again
    current[0] = ClusterSettings(routing_profiles={"p": RoutingProfile(kv_weight=3.0)})
    assert profiles.routing(POLICY, "p").kv_weight == 3.0
    other = RoutingPolicy(kv_saturation_pct=50)
    assert profiles.routing(other, "p") == RoutingPolicy(kv_weight=3.0, kv_saturation_pct=50)


@pytest.mark.parametrize(
    "body, field",
    [
        ("routing_profiles:\n  default: {kv_weight: 1}\n", "routing_profiles"),
        ("routing_profiles:\n  Bad Name: {}\n", "routing_profiles"),
        ("routing_profiles:\n  p: {kv_saturation_pct: 150}\n", "kv_saturation_pct"),
    ],
)
def test_a_bad_profile_is_refused_naming_it(body: str, field: str) -> None:
    with pytest.raises(SettingsInvalid) as refused:
        parse_settings(body)
    assert field in str(refused.value) and "line" in str(refused.value)
