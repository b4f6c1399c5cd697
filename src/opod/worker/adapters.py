"""LoRA adapters on a worker's engines, served as ``<base>:<name>``.

An adapter is attached to the engine serving its base model at run time (the
driver's :meth:`~opod.engines.base.EngineDriver.attach_adapter`), under the full
id, so requests reach the engine with their body unchanged. The heartbeat names
it in ``loaded_models`` while its base serves. An engine the supervisor
restarted has lost its adapters: :meth:`Adapters.reconcile`, run before each
heartbeat, attaches them again, and attaches the ``OPOD_ADAPTERS`` list to every
model this worker brings up, and a model's own adapters (its definition's, sent with
its load and with each change) to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from opod.contract import nodeapi
from opod.engines.base import EngineDriver
from opod.engines.errors import EngineCallError
from opod.worker.adapter_files import read_adapter, weights_architecture
from opod.worker.refusals import AdapterRefused

log = logging.getLogger("opod.worker")

DEFAULT_RANK = 16
"""The rank an engine is started for when OPOD_ADAPTERS states none (vLLM's own default)."""


def adapter_id(base: str, name: str) -> str:
    """The model id an adapter is served as, and the ``lora_name`` it is attached under."""
    return f"{base}:{name}"


@dataclass(slots=True)
class Attached:
    base: str
    name: str
    source: str
    engine_start: float
    """When the engine process it lives in started: a later start means it is gone from the engine."""
    definition: bool = False
    """One of its base model's own adapters: it goes with its base rather than holding it."""

    @property
    def id(self) -> str:
        return adapter_id(self.base, self.name)


def local_rank(source: str) -> int:
    """The rank ``r`` in a local adapter directory's ``adapter_config.json`` (PEFT's layout); 0 when there is none to read."""
    try:
        config = json.loads((Path(source) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return 0
    rank = config.get("r") if isinstance(config, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else 0


def lora_flags(driver: EngineDriver, flags: dict[str, object], wanted: list[nodeapi.Adapter]) -> dict[str, object]:
    """``flags`` with the LoRA rank the wanted adapters need, unless the plan already says one.

    Raises ``ValueError`` when adapters are wanted from an engine that cannot attach them.
    """
    if not wanted:
        return flags
    if not driver.lora_ranks:
        raise ValueError(
            f"OPOD_ADAPTERS names {len(wanted)} adapter(s), but the {driver.id} engine cannot attach LoRA adapters "
            "at run time; use the vllm engine, or leave OPOD_ADAPTERS unset"
        )
    if "max_lora_rank" in flags:
        return flags
    need = max([a.rank for a in wanted] + [DEFAULT_RANK])
    fitting = [r for r in driver.lora_ranks if r >= need]
    if not fitting:
        raise ValueError(
            f"OPOD_ADAPTERS: an adapter of rank {need} is larger than any rank {driver.id} can be started for "
            f"(at most {driver.lora_ranks[-1]})"
        )
    return {**flags, "max_lora_rank": fitting[0]}


class Adapters:
    """The adapters attached on this worker; ``engine_of(model)`` gives the serving engine's (url, start time, rank)."""

    def __init__(
        self,
        driver: EngineDriver,
        session: Callable[[], aiohttp.ClientSession],
        engine_of: Callable[[str], tuple[str, float, int] | None],
        wanted: list[nodeapi.Adapter] | None = None,
        weights_of: Callable[[str], str] = lambda _base: "",
    ) -> None:
        """``weights_of(base)``: what the engine serving ``base`` loaded (a path, or a name it resolves itself)."""
        self.driver = driver
        self._session = session
        self._engine_of = engine_of
        self._weights_of = weights_of
        self.wanted = list(wanted or [])
        self.defined: dict[str, dict[str, nodeapi.Adapter]] = {}
        """base → its definition's adapters by name, attached whenever it serves."""
        self.attached: dict[str, Attached] = {}
        self._refused: dict[str, float] = {}
        """Wanted adapters the engine refused, by id → that engine's start: not tried again until it restarts."""

    def base_of(self, model_id: str) -> str | None:
        """The base model whose engine serves ``model_id`` when it is an attached adapter that is live there."""
        held = self.attached.get(model_id)
        if held is None:
            return None
        engine = self._engine_of(held.base)
        return held.base if engine is not None and engine[1] == held.engine_start else None

    def live(self) -> list[str]:
        return [a for a in self.attached if self.base_of(a) is not None]

    def on(self, base: str) -> list[str]:
        return sorted(a.id for a in self.attached.values() if a.base == base)

    def attached_by_a_manager(self, base: str) -> list[str]:
        """The adapters on ``base`` that were attached at run time, not from OPOD_ADAPTERS nor its definition (those
        come back with the base)."""
        wanted = {w.name for w in self.wanted}
        return sorted(
            a.id for a in self.attached.values() if a.base == base and a.name not in wanted and not a.definition
        )

    def define(self, base: str, adapters: list[nodeapi.Adapter]) -> None:
        """``base``'s own adapters, as its load names them: attached once it serves (:meth:`reconcile`)."""
        self.defined[base] = {a.name: a for a in adapters if a.name and a.source and ":" not in a.name}

    def held(self) -> list[nodeapi.HeldAdapter]:
        return [
            nodeapi.HeldAdapter(id=a.id, name=a.name, source=a.source)
            for a in sorted(self.attached.values(), key=lambda a: a.id)
        ]

    def _engine(self, req: nodeapi.LoadAdapterRequest) -> tuple[str, float, int]:
        """The engine serving ``req.base`` that can take adapters: (url, start, its largest rank); else refused."""
        missing = [key for key in ("base", "name", "source") if not getattr(req, key)]
        if missing:
            raise AdapterRefused(400, f"LoadAdapterRequest: {', '.join(missing)}: required")
        if ":" in req.name:
            raise AdapterRefused(
                400, f"LoadAdapterRequest: name: {req.name!r} must not contain ':' (it is served as <base>:<name>)"
            )
        engine = self._engine_of(req.base)
        if engine is None:
            raise AdapterRefused(
                409, f"model {req.base!r} is not serving on this worker; load it before attaching adapters to it"
            )
        url, started, rank = engine
        if not rank:
            raise AdapterRefused(
                501,
                f"the {self.driver.id} engine serving {req.base!r} cannot attach LoRA adapters at run time: "
                "start it with LoRA on (the plan flag max_lora_rank, or OPOD_ADAPTERS)"
                if self.driver.lora_ranks
                else f"the {self.driver.id} engine cannot attach LoRA adapters at run time",
            )
        return url, started, rank

    def check(self, req: nodeapi.LoadAdapterRequest) -> nodeapi.AdapterFacts:
        """What the adapter's files say, with the rank the base's engine takes and the base's architecture, attaching
        nothing; ``AdapterRefused`` when the engine cannot take adapters or the files cannot be read."""
        _, _, rank = self._engine(req)
        facts = read_adapter(req.name, req.source)
        return facts.model_copy(
            update={"max_rank": rank, "base_architecture": weights_architecture(self._weights_of(req.base))}
        )

    async def attach(self, req: nodeapi.LoadAdapterRequest) -> nodeapi.AdapterResponse:
        url, started, rank = self._engine(req)
        if req.definition:  # wanted from now on, whenever its base serves here
            self.defined.setdefault(req.base, {})[req.name] = nodeapi.Adapter(name=req.name, source=req.source)
        adapter_rank = req.rank or local_rank(req.source)
        if adapter_rank > rank:
            raise AdapterRefused(
                409,
                f"adapter {req.name!r} has rank {adapter_rank}, but the engine serving {req.base!r} was started "
                f"for rank {rank} at most; raise the plan flag max_lora_rank and reload {req.base!r}",
            )
        served_as = adapter_id(req.base, req.name)
        current = self.attached.get(served_as)
        if current is not None and current.engine_start == started and current.source == req.source:
            current.definition = current.definition or req.definition
            return nodeapi.AdapterResponse(status=nodeapi.Status.READY, model=served_as)
        try:
            if current is not None and current.engine_start == started:
                await self.driver.detach_adapter(self._session(), url, served_as)  # another source under the same name
            await self.driver.attach_adapter(self._session(), url, served_as, req.source)
        except EngineCallError as err:
            raise AdapterRefused(409 if err.status == 400 else 502, str(err)) from None
        self.attached[served_as] = Attached(req.base, req.name, req.source, started, req.definition)
        log.info("adapter %s attached (%s)", served_as, req.source)
        return nodeapi.AdapterResponse(status=nodeapi.Status.READY, model=served_as)

    async def detach(self, req: nodeapi.UnloadAdapterRequest) -> nodeapi.AdapterResponse:
        served_as = adapter_id(req.base, req.name)
        dropped = self.defined.get(req.base, {}).pop(req.name, None)
        held = self.attached.get(served_as)
        if held is None and dropped is not None:  # its base is not serving now: it is no longer wanted when it does
            return nodeapi.AdapterResponse(status=nodeapi.Status.UNLOADED, model=served_as)
        if held is None:
            raise AdapterRefused(
                404, f"adapter {served_as!r} is not attached on this worker (GET /v1/adapters lists them)"
            )
        engine = self._engine_of(held.base)
        if engine is not None and engine[1] == held.engine_start:
            try:
                await self.driver.detach_adapter(self._session(), engine[0], served_as)
            except EngineCallError as err:
                if err.status != 404:  # already gone from the engine is what was asked
                    raise AdapterRefused(502, str(err)) from None
        del self.attached[served_as]
        return nodeapi.AdapterResponse(status=nodeapi.Status.UNLOADED, model=served_as)

    def forget(self, base: str) -> None:
        """The base model was unloaded: its adapters went with its engine."""
        for served_as in self.on(base):
            del self.attached[served_as]

    async def reconcile(self, bases: list[str]) -> bool:
        """Attach again what a restarted engine lost, and the wanted adapters to each serving base; True when anything changed."""
        todo = [
            nodeapi.LoadAdapterRequest(base=a.base, name=a.name, source=a.source, definition=a.definition)
            for a in self.attached.values()
            if a.base in bases and self.base_of(a.id) is None
        ]
        todo += [
            nodeapi.LoadAdapterRequest(base=base, name=d.name, source=d.source, definition=True)
            for base in bases
            for d in self.defined.get(base, {}).values()
            if adapter_id(base, d.name) not in self.attached
        ]
        todo += [
            nodeapi.LoadAdapterRequest(base=base, name=w.name, source=w.source, rank=w.rank)
            for base in bases
            for w in self.wanted
            if adapter_id(base, w.name) not in self.attached
        ]
        changed = False
        for req in todo:
            served_as, engine = adapter_id(req.base, req.name), self._engine_of(req.base)
            if engine is None or self._refused.get(served_as) == engine[1]:
                continue
            try:
                await self.attach(req)
                changed = True
            except AdapterRefused as err:
                self._refused[served_as] = engine[1]
                log.warning("adapter %s not attached: %s", served_as, err)
        return changed
