"""The operator's side of nodes through its one writer, on a real store: the store and its audit row first, then the
fleet, then the events and the reconciler; a refusal changes neither and leaves the audit to the listener."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opod.access.service import AccessService
from opod.contract.nodeapi import KVBlocks
from opod.fleet.nodes_service import NodesService
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient
from opod.security.nodetokens import NodeTokenMinter
from opod.security.signer import Signer
from opod.store import Conflict, InvalidInput, NotFound, Store
from opod.store.audit import SOURCE_API, AuditDraft, AuditRecord


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, kind: str, subject: str, detail: dict[str, Any], /) -> None:
        self.seen.append((kind, subject, detail))


class Reconciler:
    def __init__(self) -> None:
        self.kicks = 0

    def kick(self) -> None:
        self.kicks += 1


class Parts:
    def __init__(self, tmp_path: Path) -> None:
        self.store = Store.open(None, home=tmp_path)
        self.fleet = Fleet()
        self.access = AccessService.load(self.store, NodeTokenMinter(secrets.token_bytes(32)))
        self.index = PrefixIndex()
        self.events = Events()
        self.reconciler = Reconciler()
        self.workers = WorkerClient(self.access.tokens.token_for_node, Signer)
        self.service = NodesService(
            self.store,
            self.fleet,
            workers=self.workers,
            bindings=self.access,
            prefix_index=self.index,
            events=self.events,
            reconciler=self.reconciler,
        )

    def node(self, node_id: str, *, heartbeating: bool = True, silent: timedelta = timedelta(0)) -> NodeState:
        """A node registered in the store and known to the fleet: heartbeating now, or last heard ``silent`` ago."""
        seen = datetime.now(UTC) - silent
        self.store.upsert_node(node_id, hostname=node_id, os="linux", arch="x86_64", ram_gb=64, address="127.0.0.1:9")
        self.fleet.restore(NodeState(id=node_id, address="127.0.0.1:9"))
        node = self.fleet.get(node_id)
        assert node is not None
        node.inventory.last_seen = seen.timestamp()
        if heartbeating:
            node.last_heartbeat = time.monotonic()
        return node

    def audit(self) -> list[AuditRecord]:
        return self.store.list_audit(limit=100)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    made = Parts(tmp_path)
    yield made
    made.store.close()


def draft(action: str = "POST /api/v1/nodes/{id}/state") -> AuditDraft:
    return AuditDraft(actor="ops@example.com", source=SOURCE_API, action=action, body={"sent": True})


async def test_a_cordon_is_stored_with_its_audit_row_then_in_the_fleet_then_told(parts: Parts) -> None:
    node = parts.node("n1")
    audit = draft()
    assert await parts.service.set_state("n1", " Cordon ", audit) == "cordoned"
    record = parts.store.get_node("n1")
    assert (record.cordoned, record.drained) == (True, False)
    assert (node.cordoned, node.drained) == (True, False)
    assert parts.events.seen == [("node.cordoned", "n1", {})] and parts.reconciler.kicks == 1
    [row] = parts.audit()
    assert (row.action, row.target, row.status, row.actor) == (
        "POST /api/v1/nodes/{id}/state",
        "node:n1",
        200,
        "ops@example.com",
    )
    assert audit.committed

    assert await parts.service.set_state("n1", "drain", draft()) == "draining"
    assert parts.store.get_node("n1").drained and node.drained and not node.cordoned
    assert await parts.service.set_state("n1", "uncordon", draft()) == "ready"
    assert not parts.store.get_node("n1").drained and not node.drained
    assert [kind for kind, _, _ in parts.events.seen] == ["node.cordoned", "node.drained", "node.ready"]


async def test_a_state_that_is_not_one_or_a_node_not_known_changes_nothing(parts: Parts) -> None:
    node = parts.node("n1")
    audit = draft()
    with pytest.raises(InvalidInput, match=r"^state: 'asleep' is not a node state; choose ready \(or uncordon\)"):
        await parts.service.set_state("n1", "asleep", audit)
    with pytest.raises(NotFound, match=r"^node 'n_nope' is not known; GET /api/v1/nodes lists them$"):
        await parts.service.set_state("n_nope", "drain", audit)
    assert not audit.committed, "the listener records the refusal"
    assert not parts.store.get_node("n1").cordoned and not node.cordoned
    assert parts.audit() == [] and parts.events.seen == [] and parts.reconciler.kicks == 0


async def test_operator_labels_are_set_and_removed_and_a_bad_change_is_refused_whole(parts: Parts) -> None:
    node = parts.node("n1")
    node.inventory.labels = {"llmgw.io/site": "par1"}
    changed = await parts.service.set_labels("n1", {"llmgw.io/rack": "r7", "team": "search"}, None, draft())
    assert changed is node and node.inventory.operator_labels == {"llmgw.io/rack": "r7", "team": "search"}
    assert parts.store.get_node("n1").operator_labels == {"llmgw.io/rack": "r7", "team": "search"}
    assert node.inventory.all_labels()["llmgw.io/site"] == "par1"
    await parts.service.set_labels("n1", None, ["team"], draft())
    assert parts.store.get_node("n1").operator_labels == node.inventory.operator_labels == {"llmgw.io/rack": "r7"}
    assert parts.reconciler.kicks == 2 and parts.events.seen[-1] == (
        "node.labels",
        "n1",
        {"operator_labels": {"llmgw.io/rack": "r7"}},
    )

    for setting, removing, message in (
        ({"ok": "1", "bad key": "x"}, None, r"^set: label key 'bad key' must be letters"),
        ({"a": "1"}, ["a"], r"^remove: 'a' is also in set; a label is set or removed, not both$"),
        ({"long": "x" * 257}, None, r"^set: the value of 'long' is 257 characters; at most 256$"),
    ):
        with pytest.raises(InvalidInput, match=message):
            await parts.service.set_labels("n1", setting, removing, draft())
    assert parts.store.get_node("n1").operator_labels == node.inventory.operator_labels == {"llmgw.io/rack": "r7"}
    assert len(parts.audit()) == 2 and parts.reconciler.kicks == 2


async def test_an_engine_build_is_one_the_engine_has_and_is_kept_beside_the_others(parts: Parts) -> None:
    node = parts.node("n1")
    assert await parts.service.set_engine_build("n1", "llama-cpp", "Portable", draft()) == ("llamacpp", "portable")
    assert await parts.service.set_engine_build("n1", "vllm", None, draft()) == ("vllm", "auto")
    both = {"llamacpp": "portable", "vllm": "auto"}
    assert parts.store.get_node("n1").engine_builds == node.inventory.operator.engine_builds == both
    assert parts.events.seen[0] == ("node.engine_build", "n1", {"engine": "llamacpp", "build": "portable"})

    with pytest.raises(InvalidInput, match=r"^engine: 'tensorflow' is not an engine opod runs; choose one of "):
        await parts.service.set_engine_build("n1", "tensorflow", None, draft())
    with pytest.raises(InvalidInput, match=r"^build: 'cu999' is not a build of vllm; choose one of auto, none, cpu"):
        await parts.service.set_engine_build("n1", "vllm", "cu999", draft())
    assert parts.store.get_node("n1").engine_builds == node.inventory.operator.engine_builds == both
    assert len(parts.audit()) == 2


async def test_the_wanted_release_is_stored_and_a_malformed_one_refused(parts: Parts) -> None:
    node = parts.node("n1")
    node.inventory.agent_version = "0.5.0"
    assert await parts.service.want_release("n1", " 0.6.0 ", draft("POST /api/v1/nodes/{id}/upgrade")) == "0.6.0"
    assert parts.store.get_node("n1").wanted_version == node.inventory.operator.wanted_version == "0.6.0"
    assert parts.events.seen == [("node.upgrade_wanted", "n1", {"version": "0.6.0", "running": "0.5.0"})]
    for bad in (None, "", "latest"):
        with pytest.raises(InvalidInput, match=r"^version: .* is not a release; write one such as 0.6.0$"):
            await parts.service.want_release("n1", bad, draft())
    assert parts.store.get_node("n1").wanted_version == "0.6.0"
    assert [(r.action, r.target) for r in parts.audit()] == [("POST /api/v1/nodes/{id}/upgrade", "node:n1")]


async def test_a_lost_node_is_forgotten_everywhere_with_its_row(parts: Parts) -> None:
    parts.node("n1", heartbeating=False, silent=timedelta(hours=1))
    parts.access.bind_node("n1", "k_node")
    parts.index.apply("n1", "boot", KVBlocks(seq=1, block_size=16, stored=["b1", "b2"]))
    assert parts.index.leading_blocks(["b1", "b2"]) == {"n1": 2}
    await parts.service.forget("n1", draft("DELETE /api/v1/nodes/{id}"))
    assert parts.fleet.get("n1") is None
    with pytest.raises(NotFound):
        parts.store.get_node("n1")
    assert parts.access.tokens.token_id_of("n1") is None
    assert parts.index.leading_blocks(["b1", "b2"]) == {}
    assert parts.events.seen == [("node.removed", "n1", {"was": "lost"})] and parts.reconciler.kicks == 1
    [row] = parts.audit()
    assert (row.action, row.target, row.detail) == ("DELETE /api/v1/nodes/{id}", "node:n1", '{"was":"lost"}')


async def test_a_reachable_node_or_an_unreachable_one_holding_models_is_not_forgotten(parts: Parts) -> None:
    parts.node("n1")
    with pytest.raises(Conflict, match=r"^node 'n1' is reachable \(it heartbeats\); only a lost node"):
        await parts.service.forget("n1", draft())
    quiet = parts.node("n2", heartbeating=False, silent=timedelta(seconds=30))
    quiet.loaded_models = frozenset({"m1"})
    with pytest.raises(Conflict, match=r"^node 'n2' is unreachable but has m1 on it; it is lost after 5 minutes"):
        await parts.service.forget("n2", draft())
    with pytest.raises(NotFound, match="n_nope"):
        await parts.service.forget("n_nope", draft())
    assert {n.id for n in parts.fleet} == {"n1", "n2"} and len(parts.store.list_nodes()) == 2
    assert parts.audit() == [] and parts.events.seen == []


async def test_logs_check_the_lines_asked_and_say_when_the_worker_did_not_answer(parts: Parts) -> None:
    parts.node("n1")
    with pytest.raises(InvalidInput, match=r"^lines: 5000 is out of range; ask for 1 to 2000 \(300 when absent\)$"):
        await parts.service.logs("n1", 5000, None)
    with pytest.raises(NotFound):
        await parts.service.logs("n_nope", None, None)
    view = await parts.service.logs("n1", None, None)  # no token is bound to n1: the worker cannot be called
    assert (view.node, view.source, view.lines) == ("n1", "agent", None)
    assert view.error is not None and view.error.startswith("node n1 did not answer: no token for worker n1")
    await parts.workers.close()


async def test_agents_restart_asks_only_reachable_workers_and_says_which_restarted(parts: Parts) -> None:
    parts.node("n1", heartbeating=False, silent=timedelta(hours=1))
    parts.node("n2")  # reachable, but it has no token to be called with: left out
    assert await parts.service.restart_agents() == []
    assert parts.events.seen == [("agents.restarted", "", {"nodes": []})]
    await parts.workers.close()
