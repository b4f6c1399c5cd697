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

Whole cards are numbered first (0, 1, ...), in the order written; MIG instances
come after them, labelled ``CARD/migN`` (``8/mig1``), of class ``CLASS/PROFILE``.
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
_TOP = ("gpus", "unhealthy", "labels", "cpu_cores", "memory_gb", "disk_total_gb", "disk_free_gb")
_GPU = ("name", "class", "memory_gb", "memory_mb", "compute_capability", "count", "mig")
_MIG = ("profile", "memory_gb", "memory_mb", "count")
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
                raise r.fail(f"{path}.compute_capability", f"must be MAJOR.MINOR such as \"9.0\" (quote it in YAML), not {entry['compute_capability']!r}")
        count = r.count(entry.get("count", 1), f"{path}.count")
        instances = _mig(r, entry.get("mig"), f"{path}.mig", memory) if "mig" in entry else []
        for _ in range(count):
            if instances:
                split.append((card, name, klass, capability, instances))
            else:
                whole.append(InventoryGPU(index=card, label=str(card), name=name, gpu_class=klass, memory_mb=memory,
                                          compute_capability=capability, card=card))
            card += 1
    devices = list(whole)
    index = card
    for card_no, name, klass, capability, instances in split:
        for n, (profile, memory) in enumerate(instances):
            devices.append(InventoryGPU(index=index, label=f"{card_no}/mig{n}", name=name, gpu_class=f"{klass}/{profile}",
                                        memory_mb=memory, compute_capability=capability, card=card_no, mig_profile=profile))
            index += 1
    by_label = {d.label: d for d in devices}
    unhealthy = top.get("unhealthy") or {}
    if not isinstance(unhealthy, dict):
        raise r.fail("unhealthy", "must map a device label (\"3\", \"8/mig1\") to why it is unhealthy")
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
            raise r.fail(f"labels[{key!r}]", "a key is letters, digits and ._/- (starting and ending with a letter or digit)")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise r.fail(f"labels[{key!r}]", f"must be a string, not {value!r}")
        out.labels[key] = str(value)
    for key in ("cpu_cores", "memory_gb", "disk_total_gb", "disk_free_gb"):
        if key in top:
            setattr(out, key, r.count(top[key], key, most=1 << 30))
    if out.disk_total_gb and out.disk_free_gb > out.disk_total_gb:
        raise r.fail("disk_free_gb", f"{out.disk_free_gb} is more than disk_total_gb {out.disk_total_gb}")
    return out


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
