"""The models' and presets' request bodies are taken as the spec types them, never coerced: a string is not a
boolean and a boolean is not a count. Each refusal is a 400 naming the field, and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.inprocess import InProcessLeader as Leader


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    up = Leader(tmp_path_factory.mktemp("strict") / "home")
    body = {"name": "strict", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 2}}
    assert up.admin("POST", "/api/v1/models", body) == (200, {"added": "strict"})
    yield up
    up.stop()


def test_a_string_does_not_turn_automatic_presets_on(leader: Leader) -> None:
    status, error = leader.admin("PUT", "/api/v1/presets/auto", {"on": "yes"})
    assert status == 400 and error["error"].startswith("on: "), error
    assert leader.admin("GET", "/api/v1/presets")[1]["auto"] is False


def test_a_boolean_is_not_a_minimum_of_replicas(leader: Leader) -> None:
    status, error = leader.admin("POST", "/api/v1/models/strict/scale", {"min": True})
    assert status == 400 and error["error"].startswith("min: "), error
    scaling = leader.admin("GET", "/api/v1/models/strict")[1]["scaling"]
    assert (scaling["min"], scaling["max"]) == (0, 2)
