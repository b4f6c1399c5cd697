"""An engine that cannot run on the build it started with, started again on another.

Today that is llama.cpp: a prebuilt ``llama-server`` that dies with SIGILL (a CPU without the
instructions it was built for, AVX-512) falls back to the portable build. The driver decides
(``fallback_after_exit``); the engine manager (:mod:`opod.worker.engines`) stops waiting at such an
exit and starts the engine on the spec said here, and the worker's build choices
(:meth:`opod.worker.builds.EngineBuilds.died_of_sigill`) are told, so the next start skips the crash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from opod.engines.base import EngineDriver, LaunchSpec
from opod.engines.llama_binary import is_sigill
from opod.worker.model_engine import ModelEngine
from opod.worker.supervisor import ManagedProcess

log = logging.getLogger("opod.worker")

DiedOfSigill = Callable[[str, tuple[str, ...]], None]
"""Told the engine id and the command prefix of an engine that died with SIGILL and starts again on another build."""


def wants_fallback(driver: EngineDriver, exit_code: int) -> bool:
    """An exit that another build may answer: a driver that can fall back, and a death by SIGILL."""
    return hasattr(driver, "fallback_after_exit") and is_sigill(exit_code)


def fallback_spec(
    driver: EngineDriver, engine: ModelEngine, process: ManagedProcess | None, died_of_sigill: DiedOfSigill
) -> LaunchSpec | None:
    """The portable llama-server when the first one died by SIGILL; ``None`` otherwise.

    The reason is logged and shown as the engine's detail."""
    if process is None or engine.spec is None:
        return None
    choose = getattr(driver, "fallback_after_exit", None)
    if choose is None:
        return None
    decision = choose(engine.spec, process.exit_code)
    if decision is None:
        return None
    spec, message = decision
    log.warning("%s", message)
    engine.detail = message
    prefix = getattr(driver, "launch_prefix", None)
    if prefix is not None:
        died_of_sigill(driver.id, tuple(prefix(engine.spec)))
    return spec
