"""Registered workers: descriptions replaced on re-register, drain kept, last-seen moving forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from opod.store import InvalidInput, NodeRecord, NotFound, Store
from tests.store.conftest import at

# Spacing, key order, escapes and non-ASCII text a worker might send; kept exactly.
HARDWARE = '{ "gpus":[{"name":"NVIDIA H200","vram_mb":143771}],\n  "cpu" : "Xeon\\u00ae Gold", "note":"café ☕", "z":1.50e3, "a":null }'


def register(store: Store, id: str = "node-a", seconds: float = 0, **fields: Any) -> NodeRecord:
    args: dict[str, Any] = {
        "hostname": "gpu-box",
        "os": "linux",
        "arch": "x86_64",
        "ram_gb": 125.5,
        "address": "10.0.0.7:8081",
        "hardware_json": HARDWARE,
        "boot_id": "boot-1",
        "token_id": "k_token",
        "at": at(seconds),
    }
    args.update(fields)
    return store.upsert_node(id, **args)


def test_a_registered_node_reads_back_with_its_hardware_byte_for_byte(store: Store) -> None:
    node = register(store)
    assert node == store.get_node("node-a")
    assert node.hardware_json == HARDWARE
    assert (node.hostname, node.os, node.arch, node.ram_gb, node.address) == (
        "gpu-box",
        "linux",
        "x86_64",
        125.5,
        "10.0.0.7:8081",
    )
    assert (node.boot_id, node.token_id) == ("boot-1", "k_token")
    assert node.registered_at == node.last_seen_at == at(0)
    assert node.drained is False and node.drained_at is None


def test_re_registering_replaces_the_description_and_keeps_the_drain(store: Store) -> None:
    register(store)
    store.set_drained("node-a", True, at(5))
    again = register(store, seconds=10, address="10.0.0.8:8081", boot_id="boot-2", ram_gb=64, hardware_json="[]")
    assert (again.address, again.boot_id, again.ram_gb, again.hardware_json) == ("10.0.0.8:8081", "boot-2", 64.0, "[]")
    assert again.registered_at == again.last_seen_at == at(10)
    assert again.drained is True and again.drained_at == at(5)
    assert store.list_nodes() == [again]


def test_drain_and_undrain(store: Store) -> None:
    register(store)
    drained = store.set_drained("node-a", True, at(3))
    assert drained.drained and drained.drained_at == at(3)
    assert store.set_drained("node-a", True, at(9)).drained_at == at(3)  # already drained: the first time stays
    undrained = store.set_drained("node-a", False, at(12))
    assert not undrained.drained and undrained.drained_at is None
    assert store.get_node("node-a") == undrained
    with pytest.raises(InvalidInput, match="drained must be True or False"):
        store.set_drained("node-a", "yes", at(13))  # type: ignore[arg-type]


def test_touch_moves_last_seen_forward_only_for_a_batch_of_nodes(store: Store) -> None:
    register(store, "node-a")
    register(store, "node-b")
    store.touch_nodes(["node-a", "node-b", "ghost"], at(20))  # a node forgotten meanwhile is skipped
    assert store.get_node("node-a").last_seen_at == store.get_node("node-b").last_seen_at == at(20)
    store.touch_nodes(["node-a"], at(15))
    assert store.get_node("node-a").last_seen_at == at(20)
    assert store.get_node("node-a").registered_at == at(0)


def test_list_nodes_by_id_and_delete(store: Store) -> None:
    register(store, "node-c")
    register(store, "node-a")
    register(store, "node-b")
    assert [n.id for n in store.list_nodes()] == ["node-a", "node-b", "node-c"]
    store.delete_node("node-b")
    assert [n.id for n in store.list_nodes()] == ["node-a", "node-c"]
    with pytest.raises(NotFound, match="node 'node-b' is not registered"):
        store.get_node("node-b")


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_node("ghost"),
        lambda s: s.set_drained("ghost", True),
        lambda s: s.delete_node("ghost"),
    ],
    ids=["get", "set_drained", "delete"],
)
def test_an_unknown_node_is_not_found(store: Store, call: Callable[[Store], object]) -> None:
    with pytest.raises(NotFound, match="node 'ghost' is not registered; list the nodes"):
        call(store)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hardware_json": "{gpus: 1}"}, "hardware_json of node 'node-a' is not valid JSON"),
        ({"hardware_json": {"gpus": 1}}, "hardware_json of node 'node-a' must be JSON text"),
        ({"ram_gb": -1}, "ram_gb of node 'node-a' must be a finite number"),
        ({"ram_gb": float("nan")}, "ram_gb of node 'node-a' must be a finite number"),
        ({"ram_gb": True}, "ram_gb of node 'node-a' must be a finite number"),
        ({"at": __import__("datetime").datetime(2026, 1, 1)}, "has no timezone"),
    ],
)
def test_bad_node_input_is_refused(store: Store, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        register(store, **fields)
    assert store.list_nodes() == []


def test_an_empty_node_id_is_refused(store: Store) -> None:
    with pytest.raises(InvalidInput, match="node id must not be empty"):
        register(store, " ")
