"""Where one replica of a model can go: its profiles checked against each node, rule by rule.

Pure: it reads the nodes, the replicas that hold devices now and a model's
definition, and answers an :class:`Assignment` (or none) and, for every node a
profile could not use, a :class:`Rejection` naming the rule and by how much. The
reconciler (``leader.reconciler``) decides what to ask for and carries out the
answer; ``explain-placement``, ``target`` and ``headroom`` ask the same questions.

Profiles are tried highest ``priority`` first (the definition's order among
equals). A free fit on any profile wins over one that must stop replicas of a
lower class; among those, the fewest stopped. Among fitting nodes the tightest
wins (the fewest devices of the class left free, so whole nodes stay free for
replicas that need them), then the node id; a CPU profile spreads instead (the
node with the fewest replicas). A worker runs one engine per model, so a node
takes at most one replica of a model. ``weight`` is the router's, not placement's.

:class:`Planner` is the fast form for a pass placing many replicas: built once
from the fleet, it keeps devices indexed by GPU class and free count, and
:meth:`Planner.take` records each assignment so the next placement sees it.

Given a :class:`~opod.fleet.quotas.QuotaBook`, a profile whose replica would take
its owner's scope past a limit, or take what a guarantee keeps free for another
scope, is rejected on every node with the quota's reason (``quota: …``).

A replica across nodes never spans two fabrics: its nodes share one network of
:meth:`~opod.fleet.inventory.NodeInventory.networks` (nodes on no fabric share the
machine network; nodes on fabrics share a declared fabric, and a node with a down
adapter takes part in none: ``fabric: …``). Tensor parallel on one node takes free
cards that are all NVLink peers of each other when there are such, else any.
"""

from __future__ import annotations

import time
from bisect import insort
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from opod.contract.admin.catalog import CatalogModel, CatalogProfile
from opod.fleet import refusals
from opod.fleet.asks import Ask, ask_of, version_matches
from opod.fleet.inventory import NO_BUILD, GPUDevice, nvlink_set
from opod.fleet.liveness import can_place
from opod.fleet.placed import EVERY_NODE, Assignment, Held, Rejection, class_rank
from opod.fleet.quotas import Amount, QuotaBook, amount_held
from opod.fleet.state import NodeState

LOCATION_LABEL = "llmgw.io/"
"""``keep_within: rack`` reads the ``llmgw.io/rack`` label of each node."""


def place(
    name: str,
    definition: CatalogModel,
    nodes: list[NodeState],
    held: list[Held],
    *,
    klass: str,
    now: float | None = None,
    engine: str = "",
    exclude: Mapping[str, str] | None = None,
    preempt: bool = True,
) -> tuple[Assignment | None, list[Rejection]]:
    """Where one more replica of ``name`` goes, given what ``held`` holds; with every node each profile rejected.

    ``engine`` is the engine of a profile that names none (the model's own, for a definition
    without profiles); ``exclude`` maps node ids the caller rules out to why; ``preempt=False``
    takes free room only.
    """
    return Planner(nodes, held, now=now).place(
        name, definition, klass=klass, engine=engine, exclude=exclude, preempt=preempt
    )


# --- the fleet, indexed ---------------------------------------------------------------------


@dataclass(slots=True)
class _Slot:
    """One node as placement sees it during a pass: what is free on it and who holds the rest."""

    node: NodeState
    down: str
    """Why nothing new may go there (drained, cordoned, no heartbeat); empty when it may."""
    devices: dict[int, GPUDevice]
    unhealthy: list[GPUDevice]
    holder: dict[int, Held] = field(default_factory=dict)
    held: dict[str, Held] = field(default_factory=dict)
    """Replica id → the replicas on this node."""
    models: set[str] = field(default_factory=set)
    by_class: dict[str, list[int]] = field(default_factory=dict)
    """GPU class → its healthy devices' indices, ascending."""
    linked: bool = False
    """Some device has NVLink peers (worth looking for a linked set)."""
    networks: frozenset[str] | None = None
    """Where it may form a replica across nodes; read when one is asked for."""

    def __post_init__(self) -> None:
        for index in sorted(self.devices):
            self.by_class.setdefault(self.devices[index].gpu_class, []).append(index)
        self.linked = any(d.nvlink_peers for d in self.devices.values())

    def pick(self, free: list[int], count: int) -> list[int]:
        """``count`` of ``free``: NVLink peers of each other where the node has NVLink, else the first ones."""
        return nvlink_set(self.devices, free, count) if self.linked else free[:count]

    def on(self) -> frozenset[str]:
        """The networks it may form a replica across nodes on (``NodeInventory.networks``), read once a pass."""
        if self.networks is None:
            self.networks = self.node.inventory.networks()
        return self.networks

    def free(self, gpu_class: str) -> int:
        return sum(1 for i in self.by_class.get(gpu_class, ()) if i not in self.holder)


@dataclass(slots=True)
class _Fit:
    node: str
    devices: list[int]
    gpu_class: str
    preempts: list[Held]
    left: int
    """Devices of the class left free after it (the tighter, the better)."""
    blocked: str = ""
    """Why it does not fit without preempting (the rejection when the preempting fit is not taken)."""

    def key(self, class_order: int, spread: int) -> tuple[int, int, int, str]:
        """Fewest preempted, then the least class that meets the need, then the tightest node (a CPU replica: the emptiest)."""
        return (len(self.preempts), class_order, self.left if self.devices else spread, self.node)


class Planner:
    """The fleet for one placement pass: :meth:`place` asks, :meth:`take` records what was decided."""

    def __init__(
        self,
        nodes: Iterable[NodeState],
        held: Iterable[Held],
        *,
        now: float | None = None,
        quotas: QuotaBook | None = None,
    ) -> None:
        """``quotas`` holds nothing yet: the planner counts ``held`` and every replica it takes or releases in it."""
        now = time.monotonic() if now is None else now
        self.quotas = quotas
        self._free: Amount | None = None
        """What is free on the nodes that take work, for guarantees; recounted after a change."""
        self._slots: dict[str, _Slot] = {}
        for node in sorted(nodes, key=lambda n: n.id):
            ok, why = can_place(node, now)
            devices = {d.index: d for d in node.inventory.gpus if d.healthy}
            slot = _Slot(
                node=node,
                down="" if ok else why,
                devices=devices,
                unhealthy=[d for d in node.inventory.gpus if not d.healthy],
                models=set(node.loaded_models),
            )
            self._slots[node.id] = slot
        self._replicas: dict[str, Held] = {}
        self._by_load: dict[int, list[str]] = {}
        """Models held → node ids (sorted): where a CPU replica goes, the emptiest first; built once the held are in."""
        self._order: list[str] = list(self._slots)
        self._buckets: dict[str, dict[int, list[str]]] = {}
        """GPU class → free count → node ids (sorted): where a replica asking k devices of a class can go, tightest first."""
        for record in held:
            self._hold(record)
        for slot in self._slots.values():
            for gpu_class in slot.by_class:
                self._buckets.setdefault(gpu_class, {}).setdefault(slot.free(gpu_class), []).append(slot.node.id)
        self._class_order = sorted(self._buckets, key=self._class_key)
        self._class_index = {c: i for i, c in enumerate(self._class_order)}
        for slot in self._slots.values():
            self._by_load.setdefault(len(slot.models), []).append(slot.node.id)

    def _class_key(self, gpu_class: str) -> tuple[int, float, str]:
        """Smaller, older cards first: a GPU need takes the least card that meets it."""
        for nid in next(iter(self._buckets[gpu_class].values()), []):
            device = next(d for d in self._slots[nid].devices.values() if d.gpu_class == gpu_class)
            try:
                cc = float(device.compute_capability)
            except ValueError:
                cc = 0.0
            return (device.memory_mb, cc, gpu_class)
        return (0, 0.0, gpu_class)

    # --- recording what holds what ----------------------------------------------------------

    def _hold(self, record: Held) -> None:
        self._replicas[record.replica_id] = record
        if self.quotas is not None:
            self.quotas.take(record.model, amount_held(record.gpus, record.cpu_cores, record.memory_gb))
            self._free = None
        for node_id, indices in record.gpus.items():
            slot = self._slots.get(node_id)
            if slot is None:
                continue
            slot.held[record.replica_id] = record
            self._models_changed(slot, add=record.model)
            for index in indices:
                slot.holder[index] = record

    def _models_changed(self, slot: _Slot, *, add: str = "", discard: str = "") -> None:
        before = len(slot.models)
        if add:
            slot.models.add(add)
        if discard:
            slot.models.discard(discard)
        if len(slot.models) != before and self._by_load:
            self._by_load[before].remove(slot.node.id)
            insort(self._by_load.setdefault(len(slot.models), []), slot.node.id)

    def _rebucket(self, slot: _Slot, classes: set[str], before: dict[str, int]) -> None:
        for gpu_class in classes:
            buckets = self._buckets.setdefault(gpu_class, {})
            buckets[before[gpu_class]].remove(slot.node.id)
            insort(buckets.setdefault(slot.free(gpu_class), []), slot.node.id)

    def release(self, replica_id: str) -> None:
        """Forget a replica (stopped, or preempted): its devices, memory and cores are free again."""
        record = self._replicas.pop(replica_id, None)
        if record is None:
            return
        if self.quotas is not None:
            self.quotas.release(record.model, amount_held(record.gpus, record.cpu_cores, record.memory_gb))
            self._free = None
        for node_id, indices in record.gpus.items():
            slot = self._slots.get(node_id)
            if slot is None or slot.held.pop(replica_id, None) is None:
                continue
            classes = {slot.devices[i].gpu_class for i in indices if i in slot.devices}
            before = {c: slot.free(c) for c in classes}
            for index in indices:
                if slot.holder.get(index) is record:
                    del slot.holder[index]
            if (
                not any(h.model == record.model for h in slot.held.values())
                and record.model not in slot.node.loaded_models
            ):
                self._models_changed(slot, discard=record.model)
            self._rebucket(slot, classes, before)

    def take(self, assignment: Assignment, replica_id: str, klass: str) -> Held:
        """Record ``assignment`` as carried out: its preempted replicas released, the new one holding its devices."""
        for victim in assignment.preempts:
            self.release(victim)
        record = assignment.held(replica_id, klass)
        touched = {}
        for node_id, indices in record.gpus.items():
            slot = self._slots.get(node_id)
            if slot is not None:
                classes = {slot.devices[i].gpu_class for i in indices if i in slot.devices}
                touched[node_id] = (classes, {c: slot.free(c) for c in classes})
        self._hold(record)
        for node_id, (classes, before) in touched.items():
            self._rebucket(self._slots[node_id], classes, before)
        return record

    # --- the question --------------------------------------------------------------------------

    def place(
        self,
        name: str,
        definition: CatalogModel,
        *,
        klass: str,
        engine: str = "",
        exclude: Mapping[str, str] | None = None,
        preempt: bool = True,
    ) -> tuple[Assignment | None, list[Rejection]]:
        """Where one more replica of ``name`` goes now; the rejections of every profile that could not place it."""
        if definition.external is not None:
            where = definition.external.url or definition.external.peer or "an outside provider"
            return None, [
                Rejection("", "external", EVERY_NODE, f"external: served by {where}; nothing is placed for it")
            ]
        profiles = definition.profiles or [CatalogProfile()]
        order = sorted(range(len(profiles)), key=lambda i: -(profiles[i].priority or 0))
        asks = [ask_of(name, definition, profiles[i], i, engine) for i in order]
        exclude = exclude or {}
        rejections: list[Rejection] = []
        fallback: tuple[Ask, list[_Fit]] | None = None
        for ask in asks:
            if ask.problem:
                rejections.append(Rejection(ask.label, ask.pool, EVERY_NODE, ask.problem))
                continue
            if self.quotas:
                refusal = self.quotas.refusal(name, _need(ask), self.free())
                if refusal:
                    rejections.append(Rejection(ask.label, ask.pool, EVERY_NODE, refusal))
                    continue
            quick = self._quick(name, ask, klass, exclude)
            if quick:
                return self._assignment(name, ask, quick), rejections
            fits, refused = self._scan(name, ask, klass, exclude, preempt)
            chosen = self._choose(ask, fits, refused)
            if chosen and not any(f.preempts for f in chosen):
                return self._assignment(name, ask, chosen), rejections
            if chosen and fallback is None:
                fallback = (ask, chosen)
            else:
                for fit in fits:
                    refused.setdefault(fit.node, fit.blocked or "nodes: not enough nodes fit together")
            rejections += [Rejection(ask.label, ask.pool, node, why) for node, why in refused.items()]
        if fallback is not None:
            ask, chosen = fallback
            return self._assignment(name, ask, chosen), [r for r in rejections if r.profile != ask.label]
        return None, rejections

    def free(self) -> Amount:
        """GPUs, cores and memory free now on the nodes that take work (a node that does not say adds nothing)."""
        if self._free is None:
            gpus, cores, memory = 0, 0.0, 0.0
            for slot in self._slots.values():
                if slot.down:
                    continue
                gpus += sum(1 for i in slot.devices if i not in slot.holder)
                hardware = slot.node.hardware
                cores += max(float(hardware.cpu_cores or 0) - sum(h.cpu_cores for h in slot.held.values()), 0.0)
                memory += max(float(hardware.ram_gb or 0) - sum(h.memory_gb for h in slot.held.values()), 0.0)
            self._free = Amount(gpus, cores, memory)
        return self._free

    def _assignment(self, name: str, ask: Ask, fits: list[_Fit]) -> Assignment:
        victims = sorted({h.replica_id for fit in fits for h in fit.preempts})
        return Assignment(
            model=name,
            profile=ask.index,
            nodes=[f.node for f in fits],
            gpus={f.node: f.devices for f in fits},
            preempts=victims,
            memory_gb=ask.memory_gb,
            cpu_cores=ask.cpu_cores,
            gpu_class=fits[0].gpu_class if fits else "",
        )

    def _quick(self, name: str, ask: Ask, klass: str, exclude: Mapping[str, str]) -> list[_Fit]:
        """A free fit found through the indexes, in the order :meth:`_choose` ranks free fits; ``[]`` when there is none.

        GPU nodes come by class (least card first) and free count (tightest first); CPU nodes
        by how many models they hold (emptiest first). Only free fits: preempting needs the scan.
        """
        if ask.gpus:
            classes = [ask.gpu_class] if ask.gpu_class else self._class_order
            lanes = [
                (c, [self._buckets.get(c, {})[k] for k in sorted(self._buckets.get(c, {})) if k >= ask.per_node])
                for c in classes
            ]
        else:
            lanes = [("", [self._by_load[k] for k in sorted(self._by_load)])]
        for gpu_class, buckets in lanes:
            groups: dict[tuple[str, str], list[_Fit]] = {}
            for bucket in buckets:
                for node_id in bucket:
                    fit = self._check(self._slots[node_id], name, ask, klass, exclude, preempt=False)
                    if not isinstance(fit, _Fit) or fit.gpu_class != gpu_class:
                        continue
                    if ask.nodes == 1:
                        return [fit]
                    where = self._location(fit.node, ask)
                    if ask.keep_within and not where:
                        continue
                    for network in self._slots[node_id].on():
                        group = groups.setdefault((where, network), [])
                        group.append(fit)
                        if len(group) == ask.nodes:
                            return group
        return []

    def _location(self, node_id: str, ask: Ask) -> str:
        """The node's ``llmgw.io/<keep_within>`` label (its rack, row, room or site); empty without one."""
        return (
            self._slots[node_id].node.inventory.all_labels().get(LOCATION_LABEL + ask.keep_within, "")
            if ask.keep_within
            else ""
        )

    def _scan(
        self, name: str, ask: Ask, klass: str, exclude: Mapping[str, str], preempt: bool
    ) -> tuple[list[_Fit], dict[str, str]]:
        fits: list[_Fit] = []
        refused: dict[str, str] = {}
        for node_id in self._order:
            verdict = self._check(self._slots[node_id], name, ask, klass, exclude, preempt=preempt)
            if isinstance(verdict, _Fit):
                fits.append(verdict)
            else:
                refused[node_id] = verdict
        return fits, refused

    def _spread(self, node_id: str) -> int:
        return len(self._slots[node_id].models)

    def _choose(self, ask: Ask, fits: list[_Fit], refused: dict[str, str]) -> list[_Fit]:
        """The node (or ``ask.nodes`` nodes, rank 0 first) to take among the fits; ``[]`` when they are too few."""
        fits.sort(key=lambda f: f.key(self._class_index.get(f.gpu_class, 0), self._spread(f.node)))
        if ask.nodes == 1:
            return fits[:1]
        groups: dict[tuple[str, str, str], list[_Fit]] = {}
        networks: dict[str, list[str]] = {}  # network → the fitting nodes on it, for the refusal
        fitting: list[_Fit] = []
        for fit in fits:
            where = self._location(fit.node, ask)
            if ask.keep_within and not where:
                refused[fit.node] = (
                    f"keep_within: wants all {ask.nodes} nodes in one {ask.keep_within}; it has no {LOCATION_LABEL}{ask.keep_within} label"
                )
                continue
            fitting.append(fit)
            for network in self._slots[fit.node].on():
                groups.setdefault((fit.gpu_class, where, network), []).append(fit)
                networks.setdefault(network, []).append(fit.node)
        best = min(
            (g[: ask.nodes] for g in groups.values() if len(g) >= ask.nodes),
            key=lambda g: (sum(len(f.preempts) for f in g), [f.node for f in g]),
            default=[],
        )
        if not best:
            scope = f" in one {ask.keep_within}" if ask.keep_within else ""
            together: dict[tuple[str, str], int] = {}
            for fit in fitting:
                key = (fit.gpu_class, self._location(fit.node, ask))
                together[key] = together.get(key, 0) + 1
            if any(n >= ask.nodes for n in together.values()):
                why = (
                    f"fabric: a replica across {ask.nodes} nodes stays on one fabric (nodes on no fabric share the machine network); "
                    f"fitting nodes by fabric: {refusals.by_network(networks)}"
                )
            else:
                why = (
                    f"nodes: a replica needs {ask.nodes} nodes{scope} with {ask.per_node} free {ask.wanted()} each; "
                    f"{len(fitting)} fit ({', '.join(f.node for f in fitting[:8])})"
                )
            for fit in fitting:
                refused[fit.node] = why
        return best

    def _check(
        self, slot: _Slot, name: str, ask: Ask, klass: str, exclude: Mapping[str, str], *, preempt: bool
    ) -> _Fit | str:
        """A fit of ``ask`` on one node, or the rule that refuses it there and by how much."""
        node = slot.node
        if node.id in exclude:
            return f"node: {exclude[node.id]}"
        if slot.down:
            return f"node: {slot.down}"
        if name in slot.models:
            return f"replica: already holds a replica of {name} (a worker runs one engine per model)"
        if ask.nodes > 1 and not slot.on():
            return (
                f"fabric: multi_node is {node.inventory.multi_node()} (adapters whose ports are not active); "
                f"a replica across nodes takes only nodes whose fabrics are up"
            )
        if ask.engine:
            engines = node.inventory.engine_versions
            if (node.engine_id or engines) and ask.engine != node.engine_id and ask.engine not in engines:
                has = ", ".join(sorted({node.engine_id, *engines} - {""}))
                return f"engine: wants {ask.engine}, node has {has}"
            if ask.engine_version:
                version = engines.get(ask.engine, "")
                if not version:
                    return f"engine_version: wants {ask.engine} {ask.engine_version}*, node reports no {ask.engine} version"
                if not version_matches(version, ask.engine_version):
                    return f"engine_version: wants {ask.engine} {ask.engine_version}*, node has {ask.engine} {version}"
        engine = ask.engine or node.engine_id
        if engine and node.inventory.operator.engine_builds.get(engine) == NO_BUILD:
            return (
                f"engine: the operator chose no build of {engine} on this node (POST /api/v1/nodes/{node.id}/engines)"
            )
        if ask.selector:
            labels = node.inventory.all_labels()
            for key, value in sorted(ask.selector.items()):
                if key not in labels:
                    return f"node_selector: wants {key}={value}, node has no {key} label"
                if labels[key] != value:
                    return f"node_selector: wants {key}={value}, node has {key}={labels[key]}"
        victims: list[Held] = []
        devices: list[int] = []
        gpu_class = ""
        blocked = ""
        left = 0
        if ask.gpus:
            chosen = self._devices(slot, ask, klass, preempt)
            if isinstance(chosen, str):
                return chosen
            gpu_class, devices, victims, blocked, left = chosen
        for rule, need, total, reserved, unit in (
            ("min_memory_gb", ask.memory_gb, float(node.hardware.ram_gb), "memory_gb", "GB of host RAM"),
            ("cpu_cores", ask.cpu_cores, float(node.hardware.cpu_cores), "cpu_cores", "cores"),
        ):
            if not need or not total:
                continue  # unconstrained, or a node that does not say: unknown is not full
            gone = {h.replica_id for h in victims}
            taken = sum(getattr(h, reserved) for h in slot.held.values() if h.replica_id not in gone)
            if total - taken >= need:
                continue
            more = (
                self._victims(slot, klass, victims, attrgetter(reserved), need - (total - taken)) if preempt else None
            )
            if more is None:
                by = refusals.held_by(h for h in slot.held.values() if getattr(h, reserved))
                return f"{rule}: needs {need:g} {unit} free, has {max(total - taken, 0):g} ({total:g}, {taken:g} reserved{by})"
            blocked = blocked or f"{rule}: needs {need:g} {unit} free, has {max(total - taken, 0):g}"
            victims += more
        if ask.disk_gb and node.hardware.disk_free_gb and node.hardware.disk_free_gb < ask.disk_gb:
            on_disk = node.inventory.models_on_disk or []
            if not ask.sources.intersection(on_disk):
                return (
                    f"min_disk_gb: needs {ask.disk_gb:g} GB free for the weights, has {node.hardware.disk_free_gb} GB"
                )
        if victims:
            blocked += (
                " (it would preempt "
                + ", ".join(sorted({f"{h.model} [{h.klass or 'standard'}]" for h in victims}))
                + ")"
            )
        return _Fit(node=node.id, devices=devices, gpu_class=gpu_class, preempts=victims, left=left, blocked=blocked)

    def _devices(
        self, slot: _Slot, ask: Ask, klass: str, preempt: bool
    ) -> tuple[str, list[int], list[Held], str, int] | str:
        """The devices ``ask`` takes on ``slot``: (class, indices, replicas to preempt, why not freely, left free); or why none."""
        if ask.gpu_class:
            by_class = {ask.gpu_class: slot.by_class[ask.gpu_class]} if ask.gpu_class in slot.by_class else {}
        else:
            by_class = {}
            for gpu_class, indices in slot.by_class.items():
                fitting = [i for i in indices if ask.device_fits(slot.devices[i])]
                if fitting:
                    by_class[gpu_class] = fitting
        sick = [d for d in slot.unhealthy if ask.device_fits(d)] if slot.unhealthy else []
        if not by_class:
            if sick:
                return f"gpus: needs {ask.per_node} {ask.wanted()}, every one here is unhealthy ({refusals.unhealthy(sick)})"
            if not slot.devices:
                return "gpu_class: node has no GPU" if ask.gpu_class else f"gpu: wants {ask.wanted()}, node has no GPU"
            if ask.gpu_class:
                return f"gpu_class: wants {ask.gpu_class}, node has {refusals.by_class(slot.devices.values())}"
            return f"gpu: wants {ask.wanted()}, node has {refusals.by_class(slot.devices.values(), detail=True)}"
        classes = (
            sorted(by_class, key=lambda c: (self._class_index.get(c, 0), c)) if len(by_class) > 1 else list(by_class)
        )
        best: tuple[str, list[int], list[Held], str, int] | None = None
        refusal = ""
        for gpu_class in classes:
            indices = by_class[gpu_class]
            free = [i for i in indices if i not in slot.holder]
            if len(indices) < ask.per_node:
                unhealthy = sum(1 for d in sick if d.gpu_class == gpu_class)
                refusal = refusal or (
                    f"gpus: needs {ask.per_node} {gpu_class} on one node, has {len(indices)}"
                    + (f" ({unhealthy} more unhealthy)" if unhealthy else "")
                )
                continue
            if len(free) >= ask.per_node:
                return gpu_class, slot.pick(free, ask.per_node), [], "", len(free) - ask.per_node
            held_here = [slot.holder[i] for i in indices if i in slot.holder]
            why = f"gpus: needs {ask.per_node} free {gpu_class}, has {len(free)} free ({len(held_here)} held{refusals.held_by(held_here)})"
            refusal = refusal or why
            if not preempt or best is not None:
                continue
            count = lambda h, c=gpu_class: sum(  # noqa: E731
                1 for i in h.gpus.get(slot.node.id, []) if i in slot.devices and slot.devices[i].gpu_class == c
            )
            victims = self._victims(slot, klass, [], count, ask.per_node - len(free))
            if victims is not None:
                gone = {h.replica_id for h in victims}
                usable = [i for i in indices if i not in slot.holder or slot.holder[i].replica_id in gone]
                best = (gpu_class, slot.pick(usable, ask.per_node), victims, why, len(usable) - ask.per_node)
        return best if best is not None else refusal

    def _victims(
        self, slot: _Slot, klass: str, already: list[Held], gives: Callable[[Held], float], deficit: float
    ) -> list[Held] | None:
        """The fewest replicas of a lower class than ``klass`` on ``slot`` whose stopping frees ``deficit`` (by ``gives``)."""
        rank = class_rank(klass)
        chosen = {h.replica_id for h in already}
        candidates = sorted(
            (
                h
                for h in slot.held.values()
                if class_rank(h.klass) > rank and h.replica_id not in chosen and gives(h) > 0
            ),
            key=lambda h: (-gives(h), -class_rank(h.klass), h.replica_id),
        )
        out: list[Held] = []
        for victim in candidates:
            if deficit <= 0:
                break
            out.append(victim)
            deficit -= gives(victim)
        return out if deficit <= 0 else None


def _need(ask: Ask) -> Amount:
    """What one replica of ``ask`` holds once placed, as quotas count it."""
    return Amount(ask.per_node * ask.nodes if ask.gpus else 0, ask.cpu_cores * ask.nodes, ask.memory_gb * ask.nodes)
