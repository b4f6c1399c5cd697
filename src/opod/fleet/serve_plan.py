"""Every way a registry repository's files could run on this fleet, best first (``GET /api/v1/plan``).

Pure: it reads a repository as :mod:`opod.weights.registry` found it, the nodes and what holds
their devices now, and answers each way with what it needs and where it goes. A way is one
artifact (a GGUF quantisation for llama.cpp, the original safetensors for vLLM or SGLang) on the
CPU or on a number of cards of one GPU class. What it needs is its weights and its KV cache at the
asked context (:mod:`opod.catalog.kvcache`), with a tenth more for the engine's buffers; whether a
node takes it is placement's own answer (:mod:`opod.fleet.placement`) for a profile asking that,
so a plan and the reconciler never disagree. A way a serve job chooses becomes the model's profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opod.catalog.kvcache import kv_cost
from opod.contract.admin.catalog import CatalogModel, CatalogProfile
from opod.contract.admin.models import ModelplanOption, ModelservePlan, ModelservePlannedArtifact
from opod.fleet.placed import Held
from opod.fleet.placement import place
from opod.fleet.state import NodeState
from opod.weights.registry import PREFERENCE, Artifact, Repository

GIB = float(1 << 30)
BUFFERS = 1.1
"""What an engine takes beyond its weights and KV cache (compute buffers, the CUDA context), as a share."""
DEFAULT_CONTEXT = 4096
"""The context planned for when none is asked: what one request may use by default."""
ENGINES = {"gguf": ("llamacpp",), "safetensors": ("vllm", "sglang")}
ENGINE_WORDS = {"gguf": "llama.cpp", "safetensors": "vLLM or SGLang"}
CARD_COUNTS = (1, 2, 4, 8)
PLAN_NAME = "plan"
"""The name a way is placed under while it is only asked about."""


@dataclass(frozen=True, slots=True)
class Way:
    """One artifact run one way: the plan's option, and the profile a model serving it this way has."""

    artifact: Artifact
    option: ModelplanOption
    profile: CatalogProfile

    def key(self) -> tuple[bool, bool, int, int, float]:
        """Free now first, then on GPUs, then the preferred quantisation, then the fewest cards."""
        quant = self.artifact.quant.upper()
        rank = PREFERENCE.index(quant) if quant in PREFERENCE else len(PREFERENCE)
        cards = (self.option.gpus_per_node or 0) * (self.option.nodes or 1)
        return (not self.option.free_now, bool(self.option.cpu), rank, cards, self.option.need_gb or 0.0)


def need_bytes(artifact: Artifact, repo: Repository, context: int) -> tuple[int, str]:
    """Bytes one replica takes: weights and KV cache at ``context``, with the buffers; a note when KV is unknown."""
    cost = kv_cost(repo.shape)
    kv = cost.bytes_for(context)
    note = "" if kv is not None else f"the KV cache is not counted ({'; '.join(cost.notes) or 'shape unknown'})"
    return int((artifact.bytes + (kv or 0)) * BUFFERS), note


def _gb(n: float) -> float:
    return round(n / GIB, 4)


def _card_classes(nodes: list[NodeState]) -> dict[str, tuple[float, int]]:
    """GPU class → (a card's memory in GiB, the most healthy cards of it on one node)."""
    memory: dict[str, float] = {}
    most: dict[str, int] = {}
    for node in nodes:
        counts: dict[str, int] = {}
        for device in node.inventory.gpus:
            if device.healthy:
                counts[device.gpu_class] = counts.get(device.gpu_class, 0) + 1
                memory[device.gpu_class] = max(memory.get(device.gpu_class, 0.0), device.memory_mb / 1024)
        for gpu_class, count in counts.items():
            most[gpu_class] = max(most.get(gpu_class, 0), count)
    return {gpu_class: (memory[gpu_class], most[gpu_class]) for gpu_class in memory}


def _fits(profile: CatalogProfile, nodes: list[NodeState], held: list[Held], now: float) -> bool:
    definition = CatalogModel(name=PLAN_NAME, profiles=[profile])
    return place(PLAN_NAME, definition, nodes, held, klass="standard", now=now, preempt=False)[0] is not None


def _way(
    artifact: Artifact,
    profile: CatalogProfile,
    need: float,
    have: float,
    nodes: list[NodeState],
    held: list[Held],
    now: float,
) -> Way | None:
    hosts = [n for n in nodes if _fits(profile, [n], [], now)]
    if not hosts:
        return None
    cards = profile.gpus_per_node or 0
    option = ModelplanOption(
        artifact=artifact.name,
        format=artifact.format,
        engine=profile.engine,
        cpu=not cards,
        gpu_class=profile.gpu_class,
        gpus_per_node=cards or None,
        nodes=1,
        need_gb=_gb(need / cards if cards else need),
        have_gb=round(have, 2) if cards else float(max(n.hardware.ram_gb for n in hosts)),
        hosts=len(hosts),
        free_now=_fits(profile, nodes, held, now),
        bits_per_weight=artifact.bits_per_weight,
    )
    return Way(artifact, option, profile)


def ways_of(
    artifact: Artifact, repo: Repository, context: int, nodes: list[NodeState], held: list[Held], now: float
) -> list[Way]:
    """Every way ``artifact`` runs here at ``context``: on the CPU (GGUF), and on each GPU class in as few cards as hold it."""
    need, _ = need_bytes(artifact, repo, context)
    out: list[Way] = []
    for engine in ENGINES[artifact.format]:
        for gpu_class, (card_gb, most) in sorted(_card_classes(nodes).items()):
            count = next((k for k in CARD_COUNTS if k <= most and need / k <= card_gb * GIB), 0)
            if count:
                profile = CatalogProfile(engine=engine, gpu_class=gpu_class, gpus_per_node=count, tp=count)
                if (way := _way(artifact, profile, need, card_gb, nodes, held, now)) is not None:
                    out.append(way)
        if artifact.format == "gguf":
            profile = CatalogProfile(engine=engine, min_memory_gb=math.ceil(need / GIB))
            if (way := _way(artifact, profile, need, 0.0, nodes, held, now)) is not None:
                out.append(way)
    return out


def why_none(repo: Repository, format: str, context: int, nodes: list[NodeState]) -> str:
    """Why no way runs here, and what to do."""
    mine = repo.of_format(format)
    other = next((f for f in ENGINES if f != format and repo.of_format(f)), "")
    if not mine:
        also = f" (it has {other}: plan format={other})" if other else ""
        return f"format: {repo.repo} has no {format} files{also}"
    if not nodes:
        return "no node has joined this fleet: start a worker with opod join, then plan again"
    if format == "safetensors" and not _card_classes(nodes):
        return (
            "safetensors are run by vLLM or SGLang on GPUs, and no node of this fleet has a GPU: "
            "plan a GGUF repository of the same model (format=gguf) to run it with llama.cpp on CPU"
        )
    smallest = min(mine, key=lambda a: a.bytes)
    need, _ = need_bytes(smallest, repo, context)
    engines = " or ".join(ENGINES[format])
    runs = [
        n
        for n in nodes
        if not n.engine_id or n.engine_id in ENGINES[format] or set(n.inventory.engine_versions) & set(ENGINES[format])
    ]
    if not runs:
        return f"no node runs {engines} ({ENGINE_WORDS[format]} runs {format}); join a node with --engine {ENGINES[format][0]}"
    ram = max(n.hardware.ram_gb for n in runs)
    return (
        f"context: at {context} tokens the smallest file, {smallest.name}, needs {_gb(need)} GB and no node that runs "
        f"{engines} holds it (the most RAM one has is {ram} GB); plan a shorter context or a smaller quantisation"
    )


def plan(
    repo: Repository, format: str, context: int, nodes: list[NodeState], held: list[Held], *, now: float
) -> tuple[ModelservePlan, list[Way]]:
    """The plan of ``repo`` in ``format`` at ``context``, and its ways best first."""
    ways: list[Way] = []
    artifacts: list[ModelservePlannedArtifact] = []
    notes = list(repo.notes)
    for artifact in repo.artifacts:
        mine = (
            sorted(ways_of(artifact, repo, context, nodes, held, now), key=Way.key) if artifact.format == format else []
        )
        ways += mine
        artifacts.append(
            ModelservePlannedArtifact(
                name=artifact.name,
                format=artifact.format,
                bytes=artifact.bytes,
                shards=len(artifact.files),
                quant=artifact.quant or None,
                best=mine[0].option if mine else None,
            )
        )
    ways.sort(key=Way.key)
    if repo.of_format(format):
        _, kv_note = need_bytes(repo.of_format(format)[0], repo, context)
        notes += [kv_note] if kv_note else []
    reason = "" if ways else why_none(repo, format, context, nodes)
    if repo.gated and ways:
        notes.append("the repository is gated: fetching it needs HF_TOKEN of an account that accepted its conditions")
    view = ModelservePlan(
        repo=repo.repo,
        revision=repo.revision,
        format=format,
        architecture=repo.architecture or None,
        license=repo.license or None,
        params=repo.params,
        context=context,
        gated=repo.gated,
        servable=bool(ways),
        reason=reason or None,
        note="; ".join(notes) or None,
        projectors=list(repo.projectors) or None,
        artifacts=artifacts or None,
        options=[w.option for w in ways] or None,
    )
    return view, ways
