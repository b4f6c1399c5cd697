"""The operator's choice of each engine's build on this node (``POST /api/v1/nodes/{id}/engines``), carried out.

The leader repeats the choices in every heartbeat answer. :meth:`EngineBuilds.heard` acts on an
engine's choice only when it differs from the last one acted on, so nothing is redone on every
heartbeat, and a restarted worker converges at its first heartbeat.

- ``auto`` (or no choice): what the worker does by itself.
- ``none``: the engine is not to be used here. Provision says ``unsupported``, and a load for it
  fails naming the choice; the leader's placement reads the choice itself.
- llama.cpp: ``override``, ``prebuilt`` or ``portable`` pins the route its engines start on
  (:func:`opod.engines.llama_binary.resolve` with ``want``). A route this node cannot run is refused
  here: provision says ``failed`` with the reason, and llama.cpp keeps the route it had.
- vLLM and SGLang: a build such as ``cu129`` or ``cpu`` is installed into the worker's Python with
  ``OPOD_ENGINE_INSTALL_COMMAND`` (pip, from PyTorch's index of that build), in the background and once
  per choice: a failure is shown, never retried; a new choice or a worker restart tries again.
  ``<home>/engine-builds.json`` remembers what was installed, so a restart does not install it again.

Without a choice, a llama.cpp route that died with SIGILL (and fell back to the portable build) is
remembered in ``<home>/llama-sigill.json`` under its fingerprint (this CPU and that binary,
:func:`opod.engines.llama_binary.fingerprint`): the next starts go to the portable build at once,
rather than crash again first. Another CPU, or the binary replaced, is tried again.

Engines already running keep the build they started with; the next start uses the new one.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import logging
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from opod.contract import nodeapi
from opod.engines import llama_binary
from opod.engines.builds import AUTO, BUILDS, NONE
from opod.engines.errors import LaunchError
from opod.worker import installs

log = logging.getLogger("opod.worker")

INSTALLING, FAILED = "installing", "failed"
"""The EngineInstall states a build choice can hold by itself; the engine's survey says ready or unsupported."""
PACKAGES = {"vllm": "vllm", "sglang": "sglang"}
"""Engines installed with pip → their package."""
INSTALL_VAR = "OPOD_ENGINE_INSTALL_COMMAND"
DEFAULT_INSTALL = "{python} -m pip install {package} --extra-index-url {index}"
TORCH_INDEX = "https://download.pytorch.org/whl/{build}"
INSTALLED_FILE = "engine-builds.json"
SIGILL_FILE = "llama-sigill.json"


def no_build(engine: str) -> str:
    return f"the operator chose no build of {engine} here"


def install_argv(
    engine: str, build: str, *, python: str = sys.executable, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The install command for one build, placeholders filled in; ``ValueError`` naming the variable when it is malformed."""
    fill = {"python": python, "package": PACKAGES[engine], "build": build, "index": TORCH_INDEX.format(build=build)}
    return installs.command(INSTALL_VAR, DEFAULT_INSTALL, fill, environ)


@dataclass(frozen=True, slots=True)
class Chosen:
    """An engine's build choice here and what became of it."""

    build: str = AUTO
    state: str = ""
    """``installing`` or ``failed`` while they hold; empty when the engine's own survey says the rest."""
    detail: str = ""


class EngineBuilds:
    """Every engine's build choice on this worker: the route llama.cpp starts on, the pip installs, what provision shows."""

    def __init__(
        self,
        home: Path,
        *,
        on_change: Callable[[], None] = lambda: None,
        python: str = sys.executable,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """``on_change``: called when what provision shows changed (a choice acted on, an install ended)."""
        self._file = home / INSTALLED_FILE
        self._on_change = on_change
        self._python = python
        self._environ = environ
        self._chosen: dict[str, Chosen] = {}
        self._route: llama_binary.LlamaRoute | None = None
        """llama.cpp's pinned route; ``None`` = the worker's own order."""
        self._installs: dict[str, asyncio.Task[None]] = {}
        self._installed = _read(self._file)
        self._sigill_file = home / SIGILL_FILE
        self._sigill = _read(self._sigill_file)
        """Fingerprints of the llama.cpp routes that died with SIGILL here → what died, for the log line."""
        self._said_remembered = False

    def heard(self, orders: nodeapi.HeartbeatResponse) -> None:
        """A heartbeat answer's choices (the agent's ``on_orders`` hook)."""
        self.choose(orders.engine_builds or {})

    def choose(self, choices: Mapping[str, str]) -> None:
        """Act on each engine whose choice differs from the last one acted on; an engine not named is ``auto``."""
        changed = False
        for engine in BUILDS:
            build = choices.get(engine, AUTO)
            if self.chosen(engine).build == build:
                continue
            changed = True
            self._cancel_install(engine)
            if build not in BUILDS[engine]:
                self._chosen[engine] = Chosen(
                    build,
                    FAILED,
                    f"this worker knows no build {build!r} of {engine} (it has "
                    f"{', '.join(BUILDS[engine])}); it keeps the current one",
                )
            elif engine == "llamacpp":
                self._chosen[engine] = self._pin_llama(build)
            elif engine in PACKAGES and build not in (AUTO, NONE):
                self._chosen[engine] = self._install(engine, build)
            else:
                self._chosen[engine] = Chosen(build)
            log.info(
                "engine build: %s is now %s%s",
                engine,
                build,
                f" ({self._chosen[engine].detail})" if self._chosen[engine].detail else "",
            )
        if changed:
            self._on_change()

    def chosen(self, engine: str) -> Chosen:
        return self._chosen.get(engine, Chosen())

    def llama_route(self) -> llama_binary.LlamaRoute | None:
        """llama.cpp's pinned route, else the portable one where the worker's own choice died with SIGILL here
        before; ``None`` for the worker's own order."""
        return self._route or self._remembered()

    def launcher(self, engine: str) -> tuple[str, ...]:
        """The command prefix ``engine``'s next start uses (empty: its driver's choice); ``LaunchError`` when chosen ``none``."""
        if self.chosen(engine).build == NONE:
            raise LaunchError(
                "build",
                no_build(engine),
                f'choose another build with POST /api/v1/nodes/{{id}}/engines {{"engine": "{engine}"}}',
            )
        if engine == "llamacpp":
            route = self.llama_route()
            return route.argv if route is not None else ()
        return ()

    def died_of_sigill(self, engine: str, prefix: tuple[str, ...]) -> None:
        """``engine``, started with ``prefix``, died with SIGILL and starts again on the portable build: remembered
        for this CPU and that binary, so later starts skip the crash."""
        route = llama_binary.route_of(prefix)
        if engine != "llamacpp" or route.kind is llama_binary.Route.PORTABLE:
            return
        self._sigill[llama_binary.fingerprint(route)] = " ".join(route.argv)
        self._said_remembered = True  # the fallback said it already
        try:
            _write(self._sigill_file, self._sigill)
        except OSError as err:
            log.warning("could not remember that %s died with SIGILL in %s: %s", route.argv[0], self._sigill_file, err)

    def _remembered(self) -> llama_binary.LlamaRoute | None:
        """The portable route when the route llama.cpp would start on died with SIGILL on this CPU before."""
        if not self._sigill:
            return None
        try:
            route = llama_binary.resolve(self._environ)
        except LaunchError:
            return None  # the launch names what is wrong with OPOD_LLAMA_SERVER
        if route.kind is llama_binary.Route.PORTABLE or llama_binary.fingerprint(route) not in self._sigill:
            return None
        portable = llama_binary.portable_route()
        why = (
            f"{portable.why}; {route.argv[0]} died with SIGILL on this CPU before "
            f"(remembered in {self._sigill_file}; another CPU or binary is tried again)"
        )
        if not self._said_remembered:
            self._said_remembered = True
            log.info("llama.cpp starts on the portable build: %s", why)
        return llama_binary.LlamaRoute(portable.kind, portable.argv, why)

    # --- llama.cpp ------------------------------------------------------------

    def _pin_llama(self, build: str) -> Chosen:
        if build in (AUTO, NONE):
            if build == AUTO:
                self._route = None
            return Chosen(build)
        try:
            self._route = llama_binary.resolve(self._environ, want=llama_binary.Route(build))
        except LaunchError as err:
            kept = self._route.kind.value if self._route is not None else AUTO
            return Chosen(build, FAILED, f"{err.reason}; {err.remedy}; llamacpp keeps the {kept} build")
        return Chosen(build)

    # --- pip builds -------------------------------------------------------------

    def _install(self, engine: str, build: str) -> Chosen:
        if self._installed.get(engine) == build and importlib.util.find_spec(PACKAGES[engine]) is not None:
            return Chosen(build)
        try:
            argv = install_argv(engine, build, python=self._python, environ=self._environ)
        except ValueError as err:
            return Chosen(build, FAILED, str(err))
        self._installs[engine] = asyncio.get_running_loop().create_task(
            self._run_install(engine, build, argv), name=f"install {engine} {build}"
        )
        return Chosen(build, INSTALLING, f"running {shlex.join(argv)}")

    async def _run_install(self, engine: str, build: str, argv: list[str]) -> None:
        log.info("installing %s build %s: %s", engine, build, shlex.join(argv))
        outcome = await installs.run(argv, label=f"install {engine} {build}")
        if not outcome.ok:
            status = f" (exit {outcome.code})" if outcome.code >= 0 else ""
            self._finish(engine, Chosen(build, FAILED, f"installing {engine} {build} failed{status}: {outcome.last}"))
            return
        importlib.invalidate_caches()  # the new package is found by the next survey, without a restart
        self._installed[engine] = build
        _write(self._file, self._installed)
        self._finish(engine, Chosen(build))

    def _finish(self, engine: str, outcome: Chosen) -> None:
        self._installs.pop(engine, None)
        self._chosen[engine] = outcome
        if outcome.state == FAILED:
            log.warning("engine build: %s", outcome.detail)
        else:
            log.info("engine build: %s %s installed", engine, outcome.build)
        self._on_change()

    def _cancel_install(self, engine: str) -> None:
        task = self._installs.pop(engine, None)
        if task is not None:
            task.cancel()


def _read(path: Path) -> dict[str, str]:
    """A JSON object of strings kept in the worker's home; empty when absent or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _write(path: Path, value: dict[str, str]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value, sort_keys=True), encoding="utf-8")
    temporary.replace(path)
