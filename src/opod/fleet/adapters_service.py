"""A model's LoRA adapters replaced whole (``POST /api/v1/models/{name}/adapters``): read, judged, kept, attached.

Nothing attaches before every adapter of the new list is checked: each worker serving the base reads each
adapter's files (``POST /v1/adapters/check``: present, a readable ``adapter_config.json``, its rank, the model
it was trained on) and says the rank its engine takes and the architecture it serves; the leader judges those
facts against the model's definition (:func:`opod.catalog.adapters.misfit`). Only then is the list written,
through :class:`~opod.fleet.models_service.ModelsService` (the store with the change's audit row, then memory),
and pushed to those workers through the runtime path every adapter takes (``/v1/adapters/load`` and
``unload``), marked as the model's own so they go and come back with it. Replicas started later get the list
with their load (:func:`opod.leader.replicas.load_requests`). A refusal names the adapter and why, and leaves
the model's list, and what its workers serve, as they were.
"""

from __future__ import annotations

import asyncio
import logging

from opod.catalog.adapters import misfit
from opod.catalog.definition import problems
from opod.contract import nodeapi
from opod.contract.admin.catalog import CatalogAdapter
from opod.fleet.models import KnownModel, definition_of
from opod.fleet.models_service import ENGINES, ModelsService
from opod.fleet.state import Fleet, NodeState
from opod.http.nodeclient import WorkerClient, WorkerUnavailable
from opod.store.audit import AuditDraft
from opod.store.errors import Conflict, InvalidInput

log = logging.getLogger("opod.fleet")

CHECK_TIMEOUT = 30.0
ATTACH_TIMEOUT = 120.0
"""An engine may take a while over an adapter's weights."""


class AdaptersService:
    """Replaces a model's adapters: the one way the management API changes them."""

    def __init__(self, models: ModelsService, fleet: Fleet, workers: WorkerClient) -> None:
        self.models = models
        self.fleet = fleet
        self.workers = workers
        self._lock = asyncio.Lock()
        """One replacement at a time: two lists checked against each other's workers would mix."""

    async def replace(self, name: str, adapters: list[CatalogAdapter], audit: AuditDraft) -> KnownModel:
        """Check every adapter, keep the list, attach it where the model serves, detach what it no longer lists.

        Raises ``NotFound`` (no such model), ``InvalidInput`` (an adapter malformed, unreadable, or not for this
        model, named as ``adapters[i]``) or ``Conflict`` (new adapters, but no worker serves the model to read them).
        """
        async with self._lock:
            model = self.models.named(name)
            before = definition_of(model)
            wanted = before.model_copy(update={"adapters": list(adapters) or None})
            found = [p for p in problems(wanted, ENGINES) if p.startswith(("adapters", "max_loaded_adapters"))]
            if found:
                raise InvalidInput("; ".join(found))
            kept = {a.name or "": a.source for a in before.adapters or []}
            holders = self.fleet.workers_for(model.id)
            new = [a.name or "" for a in adapters if kept.get(a.name or "") != a.source]
            if new and not holders:
                raise Conflict(
                    f"adapters: no worker serves {model.id!r} now to read {', '.join(map(repr, new))} on; "
                    f"load it (POST /api/v1/models/{model.id}/scale with min 1) and send the list again"
                )
            entry_repo = model.entry.source.repo if model.entry is not None else ""
            for i, adapter in enumerate(adapters):
                where = f"adapters[{i}] ({adapter.name})"
                for node in holders:
                    reason = misfit(wanted, await self._read(node, model.id, adapter, where), entry_repo)
                    if reason:
                        raise InvalidInput(f"{where}: {reason} (read on node {node.id})")
            model = await self.models.set_adapters(model.id, adapters, audit)
            names = {a.name for a in adapters}
            await self._push(model.id, holders, adapters, [n for n in kept if n not in names])
            return model

    async def _read(self, node: NodeState, base: str, adapter: CatalogAdapter, where: str) -> nodeapi.AdapterFacts:
        """What the worker read of the adapter; ``InvalidInput`` when its files cannot be read, ``Conflict`` when the
        worker or its engine cannot take adapters now."""
        req = nodeapi.LoadAdapterRequest(base=base, name=adapter.name or "", source=adapter.source or "")
        try:
            status, body = await self.workers.call_json(
                node, "POST", nodeapi.PATH_ADAPTERS_CHECK, req.to_wire(), timeout=CHECK_TIMEOUT
            )
        except WorkerUnavailable as err:
            raise Conflict(f"{where}: node {node.id} could not be asked to read it: {err}; try again") from None
        if status == 200 and isinstance(body, dict):
            return nodeapi.AdapterFacts.model_validate(body)
        said = (body if isinstance(body, str) else str(body)).strip()[:400] or f"the worker answered {status}"
        refusal = InvalidInput if status == 400 else Conflict
        raise refusal(f"{where}: {said} (on node {node.id})")

    async def _push(
        self, base: str, holders: list[NodeState], adapters: list[CatalogAdapter], removed: list[str]
    ) -> None:
        """Attach the list on each worker serving the base and detach what it dropped.

        Each was read there a moment ago, so a failure now is the engine's; the worker keeps the list as the
        model's own and tries again before its next heartbeat, and the log says what failed.
        """
        calls: list[tuple[str, nodeapi.WireModel]] = [
            (
                nodeapi.PATH_ADAPTERS_LOAD,
                nodeapi.LoadAdapterRequest(base=base, name=a.name or "", source=a.source or "", definition=True),
            )
            for a in adapters
        ]
        calls += [(nodeapi.PATH_ADAPTERS_UNLOAD, nodeapi.UnloadAdapterRequest(base=base, name=n)) for n in removed]
        for node in holders:
            for path, req in calls:
                try:
                    status, body = await self.workers.call_json(
                        node, "POST", path, req.to_wire(), timeout=ATTACH_TIMEOUT
                    )
                except WorkerUnavailable as err:
                    status, body = 503, str(err)
                if status != 200 and not (path == nodeapi.PATH_ADAPTERS_UNLOAD and status == 404):
                    log.warning("adapters of %s on %s: %s answered %s: %s", base, node.id, path, status, body)
