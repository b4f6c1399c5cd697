"""A declared inventory: a YAML or JSON file that says what a worker has, instead of the driver.

``opod join --inventory FILE`` (or ``OPOD_INVENTORY``) reports these GPUs, MIG
instances, labels and machine figures to the leader, so whole GPU fleets run on
simulators on a CPU machine. Every problem names the field and what to write::

    gpus:
      - name: NVIDIA H100 80GB HBM3   # required
        class: H100-80GB              # what placement counts by; default: the name
        memory_gb: 80                 # or memory_mb
        compute_capability: "9.0"
        count: 8                      # default 1
      - name: NVIDIA A100-SXM4-80GB
        class: A100-80GB
        memory_gb: 80
        compute_capability: "8.0"
        mig:                          # the card split into instances (each its own device)
          - {profile: 3g.40gb, memory_gb: 40, count: 2}
    unhealthy:                        # device label → why
      "3": "XID 79: fell off the bus"
    labels: {llmgw.io/site: par1, llmgw.io/rack: r12}
    cpu_cores: 64                     # optional, like memory_gb, disk_total_gb, disk_free_gb
    memory_gb: 512
    nvlink: all                       # every whole card is an NVLink peer of every other
    nvlink_domain: nvl72-a            # the multi-node NVLink domain every whole card has joined
    fabrics:                          # the InfiniBand / RoCE fabrics the node is on
      - name: ib-a
        adapters: [mlx5_0, mlx5_1]
        state: active                 # active (the default) or down: its adapters' ports
      - name: ib-b
        adapters: [mlx5_2, {name: mlx5_3, state: down}]   # one adapter's own state

Whole cards are numbered first (0, 1, ...), in the order written; MIG instances
come after them, labelled ``CARD/migN`` (``8/mig1``), of class ``CLASS/PROFILE``.

Instead of ``nvlink: all``, a GPU entry may say ``nvlink_peers: [1, 2, 3]``: the
whole cards each card of the entry has NVLink to (its own index left out, so an
entry of ``count: 4`` with ``nvlink_peers: [0, 1, 2, 3]`` is four cards all linked).
A link goes both ways: writing it on one card is enough. A card in MIG mode has
no NVLink peers. A node that declares fabrics pairs for a replica across nodes
only with nodes on one of the same fabrics, and with none while an adapter is down
(:meth:`opod.fleet.inventory.NodeInventory.networks`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opod.contract.nodeapi import InventoryGPU

_CAPABILITY = re.compile(r"\d{1,2}\.\d{1,2}")
_PROFILE = re.compile(r"\d+g\.\d+gb(\+[a-z0-9]+)?")
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,62}")
_TOP = (
    "gpus",
    "unhealthy",
    "labels",
    "cpu_cores",
    "memory_gb",
    "disk_total_gb",
    "disk_free_gb",
    "nvlink",
    "nvlink_domain",
    "fabrics",
)
_GPU = ("name", "class", "memory_gb", "memory_mb", "compute_capability", "count", "mig", "nvlink_peers")
_MIG = ("profile", "memory_gb", "memory_mb", "count")
_FABRIC = ("name", "adapters", "state")
_ADAPTER = ("name", "state")
PORT_STATES = ("active", "down")
MAX_COUNT = 1024


class InventoryError(ValueError):
    """A declared inventory that cannot be used; the message names the file and the field."""


@dataclass(slots=True)
class Declared:
    gpus: list[InventoryGPU] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    cpu_cores: int = 0
    memory_gb: int = 0
    """0 = not declared: the machine's own figure is reported."""
    disk_total_gb: int = 0
    disk_free_gb: int = 0
    fabrics: dict[str, dict[str, str]] = field(default_factory=dict)
    """fabric name → adapter → its port's state (``active`` or ``down``)."""


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, why: str) -> InventoryError:
        return InventoryError(f"{self.where}: {path}: {why}")

    def mapping(self, value: Any, path: str, keys: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, not {type(value).__name__}")
        unknown = sorted(str(k) for k in value if k not in keys)
        if unknown:
            raise self.fail(path, f"unknown field {unknown[0]!r}; the fields are {', '.join(keys)}")
        return value

    def text(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"must be a non-empty string, not {value!r}")
        return value.strip()

    def name(self, value: Any, path: str, what: str) -> str:
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise self.fail(
                path, f"{value!r} is not {what}: letters, digits and ._:- (starting with a letter or digit), at most 63"
            )
        return value

    def count(self, value: Any, path: str, *, least: int = 1, most: int = MAX_COUNT) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise self.fail(path, f"must be a whole number from {least} to {most}, not {value!r}")
        return value

    def memory_mb(self, entry: dict[str, Any], path: str) -> int:
        """``memory_gb`` (GiB, may be fractional) or ``memory_mb``: exactly one of them."""
        if ("memory_gb" in entry) == ("memory_mb" in entry):
            raise self.fail(f"{path}.memory_gb", "say the memory once: memory_gb (GiB) or memory_mb (MiB)")
        key = "memory_gb" if "memory_gb" in entry else "memory_mb"
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.fail(f"{path}.{key}", f"must be a positive number, not {value!r}")
        return int(value * 1024) if key == "memory_gb" else int(value)


def parse(data: Any, where: str = "inventory") -> Declared:
    """A declared inventory from its parsed text; raises :class:`InventoryError` naming the field."""
    r = _Reader(where)
    if data is None:
        data = {}
    top = r.mapping(data, "(top level)", _TOP)
    out = Declared()
    gpus = top.get("gpus") or []
    if not isinstance(gpus, list):
        raise r.fail("gpus", f"must be a list of GPU entries, not {type(gpus).__name__}")
    whole: list[InventoryGPU] = []
    split: list[tuple[int, str, str, str, list[tuple[str, int]]]] = []
    links: list[tuple[range, Any, str]] = []
    """(the entry's cards, its ``nvlink_peers``, where): resolved once every card is numbered."""
    card = 0
    for i, raw in enumerate(gpus):
        path = f"gpus[{i}]"
        entry = r.mapping(raw, path, _GPU)
        if "name" not in entry:
            raise r.fail(f"{path}.name", "required: the card's model name, as in NVIDIA H100 80GB HBM3")
        name = r.text(entry["name"], f"{path}.name")
        klass = r.text(entry["class"], f"{path}.class") if "class" in entry else name
        memory = r.memory_mb(entry, path)
        capability = ""
        if "compute_capability" in entry:
            capability = str(entry["compute_capability"]).strip()
            if not _CAPABILITY.fullmatch(capability):
                raise r.fail(
                    f"{path}.compute_capability",
                    f'must be MAJOR.MINOR such as "9.0" (quote it in YAML), not {entry["compute_capability"]!r}',
                )
        count = r.count(entry.get("count", 1), f"{path}.count")
        instances = _mig(r, entry.get("mig"), f"{path}.mig", memory) if "mig" in entry else []
        if "nvlink_peers" in entry:
            if instances:
                raise r.fail(f"{path}.nvlink_peers", "a card in MIG mode has no NVLink peers; leave it out, or the mig")
            links.append((range(card, card + count), entry["nvlink_peers"], f"{path}.nvlink_peers"))
        for _ in range(count):
            if instances:
                split.append((card, name, klass, capability, instances))
            else:
                whole.append(
                    InventoryGPU(
                        index=card,
                        label=str(card),
                        name=name,
                        gpu_class=klass,
                        memory_mb=memory,
                        compute_capability=capability,
                        card=card,
                    )
                )
            card += 1
    _nvlink(r, top, whole, links, {c for c, *_ in split})
    devices = list(whole)
    index = card
    for card_no, name, klass, capability, instances in split:
        for n, (profile, memory) in enumerate(instances):
            devices.append(
                InventoryGPU(
                    index=index,
                    label=f"{card_no}/mig{n}",
                    name=name,
                    gpu_class=f"{klass}/{profile}",
                    memory_mb=memory,
                    compute_capability=capability,
                    card=card_no,
                    mig_profile=profile,
                )
            )
            index += 1
    by_label = {d.label: d for d in devices}
    unhealthy = top.get("unhealthy") or {}
    if not isinstance(unhealthy, dict):
        raise r.fail("unhealthy", 'must map a device label ("3", "8/mig1") to why it is unhealthy')
    for label, why in unhealthy.items():
        device = by_label.get(str(label))
        if device is None:
            raise r.fail(f"unhealthy[{label!r}]", f"no such device; the devices are {', '.join(by_label) or 'none'}")
        device.healthy = False
        device.why = r.text(why, f"unhealthy[{label!r}]")
    out.gpus = devices
    labels = top.get("labels") or {}
    if not isinstance(labels, dict):
        raise r.fail("labels", "must map label keys to string values")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise r.fail(
                f"labels[{key!r}]", "a key is letters, digits and ._/- (starting and ending with a letter or digit)"
            )
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise r.fail(f"labels[{key!r}]", f"must be a string, not {value!r}")
        out.labels[key] = str(value)
    for key in ("cpu_cores", "memory_gb", "disk_total_gb", "disk_free_gb"):
        if key in top:
            setattr(out, key, r.count(top[key], key, most=1 << 30))
    if out.disk_total_gb and out.disk_free_gb > out.disk_total_gb:
        raise r.fail("disk_free_gb", f"{out.disk_free_gb} is more than disk_total_gb {out.disk_total_gb}")
    out.fabrics = _fabrics(r, top.get("fabrics"))
    return out


def _nvlink(
    r: _Reader, top: dict[str, Any], whole: list[InventoryGPU], links: list[tuple[range, Any, str]], split: set[int]
) -> None:
    """Each whole card's NVLink peers (``nvlink: all`` or the entries' ``nvlink_peers``) and its NVLink domain."""
    shorthand = top.get("nvlink")
    if shorthand is not None and shorthand != "all":
        raise r.fail(
            "nvlink",
            f"{shorthand!r}: write all (every whole card linked to every other), or nvlink_peers on the GPU entries",
        )
    if shorthand and links:
        raise r.fail(links[0][2], "nvlink: all already links every card; say one or the other")
    peers: dict[int, set[int]] = {g.card: set() for g in whole}
    if shorthand:
        for card in peers:
            peers[card] = set(peers) - {card}
    for cards, listed, path in links:
        if not isinstance(listed, list) or not listed:
            raise r.fail(path, f"must be a non-empty list of card indices such as [0, 1, 2, 3], not {listed!r}")
        for j, peer in enumerate(listed):
            if isinstance(peer, bool) or not isinstance(peer, int) or not (peer in peers or peer in split):
                raise r.fail(
                    f"{path}[{j}]",
                    f"{peer!r} is not a card; the whole cards are {', '.join(map(str, peers)) or 'none'}",
                )
            if peer in split:
                raise r.fail(f"{path}[{j}]", f"card {peer} is in MIG mode, which has no NVLink peers")
            for card in cards:
                if card != peer:
                    peers[card].add(peer)
                    peers[peer].add(card)
    for gpu in whole:
        gpu.nvlink_peers = sorted(peers[gpu.card]) or None
    if "nvlink_domain" in top:
        domain = r.name(top["nvlink_domain"], "nvlink_domain", "an NVLink domain name")
        if not whole:
            raise r.fail("nvlink_domain", "no whole card to join it; declare the GPUs, or leave nvlink_domain out")
        for gpu in whole:
            gpu.nvlink_domain, gpu.fabric_state = domain, "joined"


def _fabrics(r: _Reader, value: Any) -> dict[str, dict[str, str]]:
    """fabric name → adapter → port state, from ``fabrics: [{name, adapters, state}]``."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise r.fail("fabrics", "must be a list of fabrics such as {name: ib-a, adapters: [mlx5_0, mlx5_1]}")
    out: dict[str, dict[str, str]] = {}
    owner: dict[str, str] = {}
    for i, raw in enumerate(value):
        path = f"fabrics[{i}]"
        entry = r.mapping(raw, path, _FABRIC)
        if "name" not in entry:
            raise r.fail(f"{path}.name", "required: the fabric's name, as in ib-a")
        name = r.name(entry["name"], f"{path}.name", "a fabric name")
        if name in out:
            raise r.fail(f"{path}.name", f"fabric {name!r} is declared twice; list all its adapters under one entry")
        state = _state(r, entry.get("state", "active"), f"{path}.state")
        adapters = entry.get("adapters")
        if not isinstance(adapters, list) or not adapters:
            raise r.fail(f"{path}.adapters", "required: a non-empty list of the adapters on it, as in [mlx5_0, mlx5_1]")
        ports: dict[str, str] = {}
        for j, item in enumerate(adapters):
            where = f"{path}.adapters[{j}]"
            own = state
            if isinstance(item, dict):
                item = r.mapping(item, where, _ADAPTER)
                if "name" not in item:
                    raise r.fail(f"{where}.name", "required: the adapter's name, as in mlx5_0")
                own = _state(r, item.get("state", state), f"{where}.state")
                adapter = r.name(item["name"], f"{where}.name", "an adapter name")
            else:
                adapter = r.name(item, where, "an adapter name")
            if adapter in owner:
                raise r.fail(
                    where, f"adapter {adapter!r} is already on fabric {owner[adapter]!r}; an adapter is on one fabric"
                )
            owner[adapter] = name
            ports[adapter] = own
        out[name] = ports
    return out


def _state(r: _Reader, value: Any, path: str) -> str:
    if value not in PORT_STATES:
        raise r.fail(path, f"{value!r}: write active (its ports are up) or down")
    return str(value)


def _mig(r: _Reader, value: Any, path: str, card_memory: int) -> list[tuple[str, int]]:
    if not isinstance(value, list) or not value:
        raise r.fail(path, "must be a non-empty list of instances such as {profile: 3g.40gb, memory_gb: 40, count: 2}")
    out: list[tuple[str, int]] = []
    for j, raw in enumerate(value):
        where = f"{path}[{j}]"
        entry = r.mapping(raw, where, _MIG)
        if "profile" not in entry:
            raise r.fail(f"{where}.profile", "required: the MIG profile, as in 3g.40gb")
        profile = r.text(entry["profile"], f"{where}.profile")
        if not _PROFILE.fullmatch(profile):
            raise r.fail(f"{where}.profile", f"{profile!r} is not a MIG profile such as 1g.10gb or 3g.40gb")
        memory = r.memory_mb(entry, where)
        out += [(profile, memory)] * r.count(entry.get("count", 1), f"{where}.count", most=7)
    if len(out) > 7:
        raise r.fail(path, f"a card holds at most 7 MIG instances, not {len(out)}")
    total = sum(m for _, m in out)
    if total > card_memory:
        raise r.fail(path, f"the instances need {total} MiB but the card has {card_memory} MiB")
    return out


def load(path: str | Path) -> Declared:
    """Read and check a declared inventory file (YAML, or JSON by a ``.json`` name)."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise InventoryError(f"{where}: cannot read the inventory file: {err.strerror or err}") from None
    try:
        data = json.loads(text) if where.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise InventoryError(f"{where}: not valid {'JSON' if where.endswith('.json') else 'YAML'}: {err}") from None
    return parse(data, where)
