"""The calls a gang change makes to its workers, where they need no worker to answer."""

from __future__ import annotations

import pytest

from opod.contract import nodeapi
from opod.http.nodeclient import WorkerClient
from opod.security.signer import Signer
from opod.shards import ShardError
from opod.shards.calls import Timing, load_coordinator


async def test_a_coordinator_whose_worker_is_gone_from_the_fleet_is_a_worker_failure() -> None:
    workers = WorkerClient(lambda _node: "node-token", Signer)
    with pytest.raises(ShardError) as refused:
        await load_coordinator(workers, lambda _node: None, "n1", nodeapi.LoadModelRequest(id="tiny"), Timing())
    assert refused.value.status == 502
    assert refused.value.message == "worker n1 is not in the fleet: the coordinator of tiny cannot load there"
