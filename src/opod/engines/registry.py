"""Every engine driver in one table, looked up by id or alias.

Adding a driver means adding one row to :data:`DRIVERS`; the conformance
suite (``tests/engines/test_conformance.py``) then tests it with the rest.
"""

from __future__ import annotations

from opod.contract.adminapi import EngineInfo
from opod.engines.base import EngineDriver
from opod.engines.errors import UnknownEngine
from opod.engines.llamacpp import LlamaCppDriver
from opod.engines.ollama import OllamaDriver
from opod.engines.sglang import SglangDriver
from opod.engines.sim import SimDriver
from opod.engines.vllm import VllmDriver

__all__ = ["DRIVERS", "UnknownEngine", "all_drivers", "engine_infos", "get_driver"]

DRIVERS: tuple[EngineDriver, ...] = (LlamaCppDriver(), VllmDriver(), SglangDriver(), OllamaDriver(), SimDriver())


def _index(drivers: tuple[EngineDriver, ...]) -> dict[str, EngineDriver]:
    index: dict[str, EngineDriver] = {}
    for driver in drivers:
        for name in (driver.id, *driver.aliases):
            key = name.lower()
            if key in index:  # a clash would make one engine unreachable by that name
                raise RuntimeError(f"engine name {name!r} is claimed by both {index[key].id} and {driver.id}")
            index[key] = driver
    return index


_BY_NAME = _index(DRIVERS)


def all_drivers() -> list[EngineDriver]:
    """Every registered driver, sorted by id."""
    return sorted(DRIVERS, key=lambda d: d.id)


def known_names() -> list[str]:
    """Each id with its aliases in brackets, for messages: ``llamacpp (llama-cpp, llamacpp-rpc)``."""
    return [d.id + (f" ({', '.join(d.aliases)})" if d.aliases else "") for d in all_drivers()]


def get_driver(name: str) -> EngineDriver:
    """The driver for an engine id or alias (case and surrounding spaces ignored)."""
    driver = _BY_NAME.get(name.strip().lower()) if isinstance(name, str) else None
    if driver is None:
        raise UnknownEngine(str(name), known_names())
    return driver


def engine_infos() -> list[EngineInfo]:
    """The ``engines`` rows of ``/admin/v1/capabilities``, sorted by id."""
    return [EngineInfo(id=d.id, aliases=list(d.aliases) or None, native=d.native) for d in all_drivers()]
