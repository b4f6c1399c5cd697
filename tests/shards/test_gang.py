"""A tiny F32 GGUF split over two real llama.cpp RPC parts, with a real coordinator llama-server.

A leader (in this process, see harness.py) and three ``opod join`` workers on
loopback. Refusals, the upload of the GGUF, a chat answered by the gang, the
file found by digest the second time, a create rolled back, and a delete that
leaves no engine process behind.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from opod.contract import nodeapi
from opod.engines import rpc_binary
from opod.shards import GangState, ShardError
from tests.shards.harness import MODEL, LeaderInProcess, Workers, cannot_run, tiny_entry
from tests.support.opod_process import wait_until

pytestmark = pytest.mark.engine

if cannot_run():
    pytest.skip(cannot_run(), allow_module_level=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("shards")
    (root / "leader-files").mkdir()
    entries = {
        MODEL: tiny_entry(root / "leader-files"),
        "broken-sharded": tiny_entry(root / "leader-files", name="broken-sharded", corrupt=True),
    }
    leader = LeaderInProcess(root / "leader", entries)
    workers = None
    try:
        workers = Workers(leader, root, 3)
        yield leader, workers
    finally:
        if workers is not None:
            workers.stop()
        leader.close()


def processes(leader: LeaderInProcess, node: str) -> dict[str, str]:
    status, body = leader.worker_call(node, "GET", nodeapi.PATH_PROCESS_LIST)
    assert status == 200, body
    return {p["id"]: p["status"] for p in body}


def running(leader: LeaderInProcess) -> dict[str, list[str]]:
    return {
        n: sorted(pid for pid, st in processes(leader, n).items() if st in ("starting", "running"))
        for n in ("w1", "w2", "w3")
    }


def test_too_many_shards_are_refused_with_the_numbers_and_start_nothing(fleet) -> None:
    leader, _ = fleet
    with pytest.raises(ShardError) as caught:
        leader.call(leader.manager.create(MODEL, 4))
    assert caught.value.status == 409
    assert caught.value.message.startswith("need 4 workers, have 3: w1, w2, w3;")
    assert running(leader) == {"w1": [], "w2": [], "w3": []}


def test_a_gang_serves_chat_through_the_leader_with_the_gguf_uploaded(fleet) -> None:
    leader, workers = fleet
    started = time.monotonic()
    gang = leader.call(leader.manager.create(MODEL))
    formed = time.monotonic() - started
    assert gang.state is GangState.SERVING
    assert gang.coordinator.node == "w1" and [p.node for p in gang.parts] == ["w1", "w2"]
    # The file was absent on w1: it was uploaded, and the worker kept it under the digest the leader computed.
    assert gang.coordinator.uploaded
    kept = Path(gang.coordinator.weights)
    assert kept.is_relative_to(workers.home("w1"))
    source = leader.entries[MODEL].source.path
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == hashlib.sha256(Path(source).read_bytes()).hexdigest()
    # The coordinator is w1's llama-server for the model, started with both parts.
    status, info = leader.worker_call("w1", "GET", f"{nodeapi.PATH_PROCESS_GET}?id=engine-{MODEL}")
    assert status == 200 and info["status"] == "running"
    assert info["args"][info["args"].index("--rpc") + 1] == gang.rpc_list()
    assert leader.serves(MODEL)

    status, answer = leader.chat()
    assert status == 200, answer
    assert answer["model"] == MODEL and answer["choices"][0]["message"]["content"].strip()
    # Each part served the coordinator: llama.cpp's RPC server logs every client it accepts.
    for part in gang.parts:
        status, text = leader.worker_call(
            part.node, "GET", f"{nodeapi.PATH_PROCESS_LOGS}?id={part.process_id}&lines=50"
        )
        assert "Accepted client connection" in text, (part.node, text)
    kinds = [e for e in leader.events if e[0] == "shard.created"]
    assert kinds and kinds[-1][2]["gang"] == gang.id and kinds[-1][2]["uploaded"] is True
    print(f"\ngang formed in {formed:.2f}s: {gang.timings}")


def test_the_worker_checks_the_digest_of_a_kept_file(fleet) -> None:
    leader, _ = fleet
    gang = leader.call(leader.manager.list())[0]
    name = Path(gang.coordinator.weights).name
    status, _ = leader.worker_call("w1", "HEAD", f"{nodeapi.PATH_PROCESS_FILE}?name={name}&sha256={'0' * 64}")
    assert status == 404


def test_a_second_gang_takes_another_coordinator_and_the_next_free_ports(fleet) -> None:
    leader, _ = fleet
    first = leader.call(leader.manager.list())[0]
    gang = leader.call(leader.manager.create(MODEL))
    try:
        # w1 already coordinates the first gang (one engine per model per worker); w2 takes this one.
        assert gang.coordinator.node == "w2" and gang.coordinator.uploaded
        # On one machine the first gang holds base+0 and base+1: each part moved one gang-width on.
        base = first.port_base
        assert sorted(p.port for p in first.parts) == [base, base + 1]
        assert sorted(p.port for p in gang.parts) == [base + 2, base + 3]
        status, answer = leader.chat()
        assert status == 200, answer
    finally:
        leader.call(leader.manager.delete_gang(MODEL, gang.id))
    assert [g.id for g in leader.call(leader.manager.list())] == [first.id]
    with pytest.raises(ShardError, match=f"model '{MODEL}' has no gang 'gnope'; its gangs: {first.id}"):
        leader.call(leader.manager.delete_gang(MODEL, "gnope"))


def test_deleting_the_model_stops_every_process(fleet) -> None:
    leader, workers = fleet
    removed = leader.call(leader.manager.delete(MODEL))
    assert len(removed.removed) == 1 and removed.unreached == []
    assert running(leader) == {"w1": [], "w2": [], "w3": []}
    wait_until(lambda: not leader.serves(MODEL), 15, "the leader to stop routing the model")
    wait_until(lambda: workers.engine_processes() == [], 10, "every llama.cpp process to exit")
    assert leader.call(leader.manager.list()) == []
    assert [e[0] for e in leader.events].count("shard.removed") == 2
    with pytest.raises(ShardError, match="has no gangs; there are no gangs"):
        leader.call(leader.manager.delete(MODEL))


def test_a_second_create_finds_the_file_by_digest(fleet) -> None:
    leader, _ = fleet
    gang = leader.call(leader.manager.create(MODEL))
    try:
        assert gang.coordinator.node == "w1" and not gang.coordinator.uploaded
        assert leader.chat()[0] == 200
    finally:
        leader.call(leader.manager.delete(MODEL))


def test_a_failed_create_rolls_back_what_it_started(fleet) -> None:
    leader, workers = fleet
    with pytest.raises(ShardError) as caught:
        leader.call(leader.manager.create("broken-sharded"))
    message = caught.value.message
    print("\n" + message)
    assert message.startswith("creating a gang of broken-sharded failed: the coordinator of broken-sharded on w1")
    assert "rolled back: stopped the parts on w1, w2 and unloaded the coordinator on w1" in message
    assert running(leader) == {"w1": [], "w2": [], "w3": []}
    wait_until(lambda: workers.engine_processes() == [], 10, "every llama.cpp process to exit")
    assert leader.call(leader.manager.list()) == []


def test_the_records_survive_a_leader_restart_as_json(fleet) -> None:
    leader, _ = fleet
    gang = leader.call(leader.manager.create(MODEL))
    try:
        saved = leader.on_loop(leader.manager.to_json)
        leader.on_loop(lambda: leader.manager.from_json(saved))
        restored = leader.call(leader.manager.list())
        assert [g.id for g in restored] == [gang.id] and restored[0].rpc_list() == gang.rpc_list()
        assert leader.call(leader.manager.heal_once()) == []  # everything it names still runs
    finally:
        leader.call(leader.manager.delete(MODEL))


def test_a_gguf_whose_digest_differs_from_the_catalog_pin_is_refused_before_anything_starts(
    fleet, tmp_path: Path
) -> None:
    leader, _ = fleet
    pinned = tiny_entry(tmp_path, name="pinned-sharded", sha256="0" * 64)
    leader.entries["pinned-sharded"] = pinned
    with pytest.raises(ShardError) as caught:
        leader.call(leader.manager.create("pinned-sharded"))
    assert caught.value.status == 400
    assert f"but the catalog pins {'0' * 64}; replace the file or correct source.sha256" in caught.value.message
    assert running(leader) == {"w1": [], "w2": [], "w3": []}


def test_a_part_command_missing_on_a_worker_is_followed_by_the_next_one(fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    leader, _ = fleet
    real = rpc_binary.fallback_commands(rpc_binary.resolve({}))[0]
    # The leader's path does not exist on this worker; the next name does.
    monkeypatch.setattr(rpc_binary, "fallback_commands", lambda route: ["/nonexistent/rpc-server", real])
    gang = leader.call(leader.manager.create(MODEL))
    try:
        assert {p.command for p in gang.parts} == {real}
        assert leader.chat()[0] == 200
    finally:
        leader.call(leader.manager.delete(MODEL))
