"""The one writer of the operator's side of nodes: state, labels, engine builds, the wanted release, forgetting.

A worker reports its own side (devices, labels, software) by heartbeat; the operator's side
(cordon or drain, operator labels, engine builds, the release it should run) is the
operator's word, kept in the store and surviving re-registration. :class:`NodesService`
changes it in one order: the store, in one transaction with the change's audit row; then the
node in the fleet; then those who follow (the lifecycle events, the reconciler, which may
place differently on a node cordoned or labelled anew). Forgetting a node also unbinds its
node token (access, told through :class:`NodeBindings`) and drops its cached prefix blocks.

The calls the operator makes of workers through the management API (a node's logs, the agents
restarted) are here too, so the management API's handlers only parse and answer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import aiohttp

from opod.contract import nodeapi
from opod.contract.admin.fleet import LogsView
from opod.engines.builds import builds_of
from opod.engines.registry import UnknownEngine, get_driver, known_names
from opod.fleet.followers import EventSink, Reconciling
from opod.fleet.liveness import LOST, STATE_WORDS, node_state, reachability, state_flags
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict, InvalidInput, NotFound
from opod.store.offloop import run_sync

log = logging.getLogger("opod.fleet")

LOG_LINES, MAX_LOG_LINES = 300, 2000
"""Lines of a node's log sent when the caller names no number, and the most it may ask for."""
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?")
_BUILD = re.compile(r"[a-z0-9][a-z0-9._+-]{0,31}")
_VERSION = re.compile(r"v?[0-9][0-9A-Za-z.+-]{0,63}")
_STATE_EVENTS = {"draining": "node.drained", "cordoned": "node.cordoned"}
"""The event of each state a node is put in; ``node.ready`` for the rest."""


class NodeBindings(Protocol):
    """Which node token each node signs with (``opod.access.service.AccessService``, above the fleet)."""

    def forget_node(self, node_id: str) -> None:
        """The node is gone from the store: its next call must register again, with any active token."""
        ...


def silent_for(node: NodeState, wall: float) -> float:
    """Seconds since the node was last heard from by the wall clock (``time.time()``); infinite before any word."""
    return wall - node.inventory.last_seen if node.inventory.last_seen else float("inf")


def reach(node: NodeState) -> str:
    """``""`` when the node heartbeats now, else ``unreachable`` or ``lost`` (:func:`~opod.fleet.liveness.reachability`)."""
    return reachability(node, time.monotonic(), silent_for(node, time.time()))


def _target(node_id: str) -> str:
    return f"node:{node_id}"


class NodesService:
    """Changes the operator's side of nodes: the store with its audit row, then the fleet, then the followers."""

    def __init__(
        self,
        store: Store,
        fleet: Fleet,
        *,
        workers: WorkerClient,
        bindings: NodeBindings,
        prefix_index: PrefixIndex,
        events: EventSink,
        reconciler: Reconciling,
    ) -> None:
        self.store = store
        self.fleet = fleet
        self.workers = workers
        """Signed calls to the workers (their logs, their agents' restarts)."""
        self.bindings = bindings
        self.prefix_index = prefix_index
        """The routing's cached prefix blocks, which a forgotten node's leave."""
        self.events = events
        self.reconciler = reconciler

    def known(self, node_id: str) -> NodeState:
        """The node in the fleet; ``NotFound`` when there is none of that id."""
        node = self.fleet.get(node_id)
        if node is None:
            raise NotFound(f"node {node_id!r} is not known; GET /api/v1/nodes lists them")
        return node

    # --- the operator's side -------------------------------------------------------------

    async def set_state(self, node_id: str, state: str | None, audit: AuditDraft) -> str:
        """Cordon, drain or make ready (a word of ``STATE_WORDS``, any case); answers the node's state now."""
        node = self.known(node_id)
        word = (state or "").strip().lower()
        if word not in STATE_WORDS:
            raise InvalidInput(f"state: {state!r} is not a node state; choose ready (or uncordon), cordon or drain")
        drained, cordoned = state_flags(word)
        with audit.commit(target=_target(node_id)) as row:
            await run_sync(self.store.set_state, node_id, drained=drained, cordoned=cordoned, audit=row)
        self.fleet.set_state(node_id, drained=drained, cordoned=cordoned)
        now = node_state(node)
        self.events(_STATE_EVENTS.get(now, "node.ready"), node_id, {})
        self.reconciler.kick()
        return now

    async def set_labels(
        self, node_id: str, setting: Mapping[str, str] | None, removing: Sequence[str] | None, audit: AuditDraft
    ) -> NodeState:
        """Set and remove operator labels (over the worker's own of the same key); answers the node changed."""
        node = self.known(node_id)
        labels = _label_changes(node.inventory.operator_labels, setting or {}, removing or ())
        with audit.commit(target=_target(node_id)) as row:
            await run_sync(self.store.set_operator_side, node_id, labels=labels, audit=row)
        node.inventory.operator_labels = labels
        self.events("node.labels", node_id, {"operator_labels": labels})
        self.reconciler.kick()  # a node selector may match it now, or no longer
        return node

    async def set_engine_build(
        self, node_id: str, engine: str | None, build: str | None, audit: AuditDraft
    ) -> tuple[str, str]:
        """Choose the build of an engine the node runs (``auto`` when none is named); answers (engine id, build)."""
        node = self.known(node_id)
        try:
            engine_id = get_driver(engine or "").id
        except UnknownEngine:
            raise InvalidInput(
                f"engine: {engine!r} is not an engine opod runs; choose one of {', '.join(known_names())}"
            ) from None
        chosen = (build or "auto").strip().lower()
        if not _BUILD.fullmatch(chosen) or chosen not in builds_of(engine_id):
            raise InvalidInput(
                f"build: {build!r} is not a build of {engine_id}; choose one of {', '.join(builds_of(engine_id))}"
            )
        builds = dict(node.inventory.operator.engine_builds) | {engine_id: chosen}
        with audit.commit(target=_target(node_id)) as row:
            await run_sync(self.store.set_operator_side, node_id, engine_builds=builds, audit=row)
        node.inventory.operator.engine_builds = builds
        self.events("node.engine_build", node_id, {"engine": engine_id, "build": chosen})
        return engine_id, chosen

    async def want_release(self, node_id: str, version: str | None, audit: AuditDraft) -> str:
        """The release of opod the node's agent should run (it upgrades itself, where it can); answers it."""
        node = self.known(node_id)
        wanted = (version or "").strip()
        if not _VERSION.fullmatch(wanted):
            raise InvalidInput(f"version: {version!r} is not a release; write one such as 0.6.0")
        with audit.commit(target=_target(node_id)) as row:
            await run_sync(self.store.set_operator_side, node_id, wanted_version=wanted, audit=row)
        node.inventory.operator.wanted_version = wanted
        self.events("node.upgrade_wanted", node_id, {"version": wanted, "running": node.inventory.agent_version})
        return wanted

    async def forget(self, node_id: str, audit: AuditDraft) -> None:
        """Forget a node: a lost one, or an unreachable one with nothing on it (``Conflict`` for any other)."""
        node = self.known(node_id)
        was = reach(node)
        if not was:
            raise Conflict(
                f"node {node_id!r} is reachable (it heartbeats); only a lost node, or an unreachable one with nothing "
                "on it, can be forgotten: stop its worker first"
            )
        held = sorted({*node.loaded_models, *node.model_engines})
        if was != LOST and held:
            raise Conflict(
                f"node {node_id!r} is unreachable but has {', '.join(held)} on it; it is lost after "
                "5 minutes without a word, and can be forgotten then"
            )
        with audit.commit(target=_target(node_id), detail={"was": was}) as row:
            await run_sync(self.store.delete_node, node_id, audit=row)
        self.fleet.remove(node_id)
        self.bindings.forget_node(node_id)
        self.prefix_index.forget(node_id)
        self.events("node.removed", node_id, {"was": was})
        self.reconciler.kick()

    # --- calls to the workers --------------------------------------------------------------

    async def logs(self, node_id: str, lines: int | None, source: str | None) -> LogsView:
        """The last ``lines`` (300 when absent) of one of the node's logs (``agent`` when absent), as the worker
        answered; a worker that did not answer is said in ``error``, a log it does not have is ``InvalidInput``."""
        node = self.known(node_id)
        count = LOG_LINES if lines is None else lines
        if not 1 <= count <= MAX_LOG_LINES:
            raise InvalidInput(f"lines: {lines} is out of range; ask for 1 to {MAX_LOG_LINES} (300 when absent)")
        wanted = source or "agent"
        path = nodeapi.PATH_LOGS
        try:
            headers = self.workers.signed_headers(node, "GET", path)
            async with self.workers.session.get(
                node.base_url() + path,
                params={"source": wanted, "lines": str(count)},
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as resp:
                status = resp.status
                answer: Any = (
                    await resp.json(content_type=None)
                    if resp.content_type == "application/json"
                    else {"error": (await resp.text()).strip()}
                )
        except (WorkerUnavailable, aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            return LogsView(
                node=node_id, source=wanted, error=f"node {node_id} did not answer: {err or type(err).__name__}"
            )
        if status == 404 and isinstance(answer, dict) and "sources" in answer:
            raise InvalidInput(f"source: node {node_id} has no log {wanted!r}; it has {', '.join(answer['sources'])}")
        if status != 200 or not isinstance(answer, dict):
            error = answer.get("error") if isinstance(answer, dict) else str(answer)
            return LogsView(node=node_id, source=wanted, error=f"node {node_id} answered HTTP {status}: {error}")
        return LogsView(node=node_id, source=wanted, lines=answer.get("lines") or [], sources=answer.get("sources"))

    async def restart_agents(self) -> list[str]:
        """Each reachable worker starts its agent again, its engines kept serving: ``opod join``'s as a new process
        (``worker.adoption``), ``opod up``'s own in place. Answers the ids of those that did; a worker that cannot
        now (a model's weights still being fetched there) answers 409 and is left out."""
        restarted: list[str] = []
        for node in self.fleet:
            if reach(node):
                continue
            try:
                status, answer = await self.workers.call_json(node, "POST", nodeapi.PATH_AGENT_RESTART, {}, timeout=15)
            except WorkerUnavailable as err:
                log.warning("agent restart: %s", err)
                continue
            if status == 200:
                restarted.append(node.id)
            else:
                log.warning("agent restart: node %s answered HTTP %s: %s", node.id, status, str(answer).strip()[:300])
        self.events("agents.restarted", "", {"nodes": restarted})
        return restarted


def _label_changes(current: Mapping[str, str], setting: Mapping[str, str], removing: Sequence[str]) -> dict[str, str]:
    """The operator labels after a change, each refused whole (``InvalidInput``) before anything is written."""
    labels = dict(current)
    for key in removing:
        if key in setting:
            raise InvalidInput(f"remove: {key!r} is also in set; a label is set or removed, not both")
        labels.pop(key, None)
    for key, value in setting.items():
        if not _LABEL_KEY.fullmatch(key):
            raise InvalidInput(
                f"set: label key {key!r} must be letters, digits and ._/- (starting and ending with a letter or digit), "
                "at most 253 characters, as in llmgw.io/rack"
            )
        if len(value) > 256:
            raise InvalidInput(f"set: the value of {key!r} is {len(value)} characters; at most 256")
        labels[key] = value
    return labels
