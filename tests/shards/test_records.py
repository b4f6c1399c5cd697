"""The gang record round-trips through the lead's store, and bad stored text is refused with the reason."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from opod.shards.records import (
    Coordinator,
    CreateShards,
    Gang,
    GangState,
    Part,
    ProcessState,
    gangs_from_json,
    gangs_to_json,
)


def sample() -> Gang:
    gang = Gang(
        id="g0123abcd",
        model="m",
        shards=2,
        port_base=50052,
        state=GangState.SERVING,
        coordinator=Coordinator(
            node="n1", address="10.0.0.1:8081", weights="/w/m.gguf", uploaded=True, state=ProcessState.RUNNING
        ),
    )
    gang.parts = [
        Part(
            index=i,
            node=f"n{i + 1}",
            address=f"10.0.0.{i + 1}:{50052 + i}",
            port=50052 + i,
            process_id=f"shard-m-g0123abcd-p{i}",
            state=ProcessState.RUNNING,
        )
        for i in (1, 0)
    ]
    return gang


def test_the_rpc_list_follows_part_order() -> None:
    assert sample().rpc_list() == "10.0.0.1:50052,10.0.0.2:50053"


def test_gangs_round_trip_through_json() -> None:
    text = gangs_to_json([sample()])
    assert json.loads(text)["version"] == 1
    assert gangs_from_json(text) == [sample().model_copy(update={"created_at": gangs_from_json(text)[0].created_at})]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "not JSON"),
        ('{"version": 9, "gangs": []}', "format version 9; this leader reads version 1"),
        ('{"version": 1, "gangs": [{"id": "g"}]}', "gangs.0.model: Field required"),
    ],
)
def test_unreadable_stored_gangs_are_refused_whole(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        gangs_from_json(text)


def test_a_create_request_bounds_the_shard_count() -> None:
    assert CreateShards.model_validate({"model": "m"}).shards is None
    with pytest.raises(ValidationError):
        CreateShards.model_validate({"model": "m", "shards": 0})
    with pytest.raises(ValidationError):
        CreateShards.model_validate({"model": ""})
