"""A sharded model through the manager contract: POST /admin/v1/shards/create, a chat answered by the gang, DELETE."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ports import free_port
from opod.weights.tiny import write_tiny_llama
from tests.shards.harness import cannot_run
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, alive, clean_env, http, opod_cli, wait_until

pytestmark = pytest.mark.engine


def test_a_gang_is_created_serves_and_is_removed_through_admin_v1(tmp_path: Path) -> None:
    if cannot_run():
        pytest.skip(cannot_run())
    gguf = write_tiny_llama(tmp_path / "tiny-split.gguf", layers=4)
    leader = Leader(tmp_path / "leader")
    token = leader.node_token()
    workers = []
    try:
        for name in ("n_s1", "n_s2", "n_s3"):
            home = tmp_path / name
            workers.append(
                OpodProcess(
                    ["join", leader.url, "--token", token, "--listen", f"127.0.0.1:{free_port()}"],
                    home,
                    env=clean_env(home, OPOD_NODE_ID=name),
                )
            )
        for worker in workers:
            worker.wait_for_line("registered with", timeout=30)
        assert (
            opod_cli(leader, "model", "add", "--gguf", str(gguf), "--name", "tiny-split", "--no-load").returncode == 0
        )

        status, _, gang = http(
            "POST",
            leader.url + "/admin/v1/shards/create",
            {"model": "tiny-split", "shards": 2},
            key=leader.key,
            timeout=120,
        )
        assert status == 201, gang
        assert len(gang["parts"]) == 2 and gang["coordinator"]["node"]
        leader.wait_served("tiny-split", timeout=60)
        status, _, answer = http(
            "POST",
            leader.url + "/v1/chat/completions",
            {"model": "tiny-split", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6},
            key=leader.key,
        )
        assert status == 200 and answer["choices"][0]["message"]["content"], answer
        status, _, listed = http("GET", leader.url + "/admin/v1/shards", key=leader.key)
        assert status == 200 and [g["id"] for g in listed] == [gang["id"]]

        status, _, refused = http(
            "POST", leader.url + "/admin/v1/shards/create", {"model": "tiny-split", "shards": 9}, key=leader.key
        )
        assert status == 409 and "need" in refused["error"]["message"]

        processes = [pid for w in workers for pid in w.children()]
        status, _, removed = http("DELETE", leader.url + "/admin/v1/shards/tiny-split", key=leader.key, timeout=120)
        assert status == 200 and removed["removed"], removed
        wait_until(lambda: "tiny-split" not in leader.served(), 30, "the sharded model to be gone")
        wait_until(lambda: not [p for p in processes if alive(p)], 30, "every RPC part and the coordinator to stop")

        def event_types() -> set[str]:
            status, _, events = http("GET", leader.url + "/admin/v1/events/stream?after=0&limit=1000", key=leader.key)
            assert status == 200, events
            return {e["type"] for e in events["events"]}

        # The stream shows committed rows; the ledger's writer commits them in batches, so a reader polls.
        wait_until(lambda: {"shard.created", "shard.removed"} <= event_types(), 15, "both gang events on the stream")
    finally:
        for worker in workers:
            worker.stop()
        leader.stop()
