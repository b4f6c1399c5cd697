"""Ollama: a daemon its operator runs (``ollama serve``), holding many models at once.

opod never launches it: :meth:`OllamaDriver.argv` raises
:class:`~opod.engines.errors.NotLaunchable`, and the worker connects to the
daemon's address (``http://127.0.0.1:11434`` by default) instead of
supervising a process. Wire facts this driver relies on (Ollama's API docs):

- ``GET /api/version`` is the liveness probe;
- ``/api/tags`` lists installed models, ``/api/ps`` the resident ones;
- ``POST /api/generate`` with only ``model`` and ``keep_alive`` loads a model
  (a negative keep_alive pins it), ``keep_alive: 0`` unloads it;
- there is no Prometheus endpoint, and no tokenizer endpoint.
"""

from __future__ import annotations

import time

import aiohttp

from opod.engines.base import EngineDriver, LaunchSpec, LoadSample, MetricsState
from opod.engines.enginehttp import call_json, try_json
from opod.engines.errors import NotLaunchable

DEFAULT_KEEP_ALIVE = "5m"
"""Ollama's own default residency after the last request; ``pin`` replaces it with forever (-1)."""


class OllamaDriver(EngineDriver):
    id = "ollama"
    native = "ollama_name"
    dialect = "ollama"
    health_path = "/api/version"
    metrics_path = None
    launchable = False
    loading_status = None
    can_unload = True
    serves_many_models = True
    default_port = 11434

    def canonical_model_name(self, name: str) -> str:
        """Ollama lists a name without a tag under its default tag: ``llama3.2`` is ``llama3.2:latest``."""
        last = name.rsplit("/", 1)[-1]
        return name if ":" in last else name + ":latest"

    def argv(self, spec: LaunchSpec) -> list[str]:
        raise NotLaunchable(
            f"ollama is a daemon its operator runs ('ollama serve'); opod does not launch it. "
            f"Start Ollama yourself and the worker connects to it (default http://127.0.0.1:{self.default_port}); "
            f"models such as {spec.model!r} are then loaded through its API."
        )

    def parse_metrics(
        self, text: str, previous: MetricsState | None, now: float | None = None
    ) -> tuple[LoadSample, MetricsState]:
        """Ollama publishes no metrics: every reading is "not said"."""
        now = time.time() if now is None else now
        return LoadSample(sampled_at=now), MetricsState(at=now)

    async def sample(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        previous: MetricsState | None,
        spec: LaunchSpec | None = None,
    ) -> tuple[LoadSample, MetricsState] | None:
        """An empty sample while the daemon answers ``/api/ps``; ``None`` when it does not."""
        if await try_json(session, base_url + "/api/ps") is None:
            return None
        return self.parse_metrics("", previous)

    async def served_models(self, session: aiohttp.ClientSession, base_url: str) -> list[str] | None:
        """Installed models: the daemon answers for each, loading a cold one on its first request."""
        return await self.installed_models(session, base_url)

    async def installed_models(self, session: aiohttp.ClientSession, base_url: str) -> list[str] | None:
        return _names(await try_json(session, base_url + "/api/tags"))

    async def resident_models(self, session: aiohttp.ClientSession, base_url: str) -> list[str] | None:
        """Models in memory now; an installed model not in this list is cold."""
        return _names(await try_json(session, base_url + "/api/ps"))

    async def load(self, session: aiohttp.ClientSession, base_url: str, model: str, *, pin: bool = False) -> None:
        body = {"model": model, "keep_alive": -1 if pin else DEFAULT_KEEP_ALIVE, "stream": False}
        await call_json(
            session,
            "POST",
            base_url + "/api/generate",
            engine=self.id,
            what=f"load {model}",
            body=body,
            timeout=aiohttp.ClientTimeout(total=600),
        )

    async def unload(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        body = {"model": model, "keep_alive": 0, "stream": False}
        await call_json(
            session,
            "POST",
            base_url + "/api/generate",
            engine=self.id,
            what=f"unload {model}",
            body=body,
            timeout=aiohttp.ClientTimeout(total=60),
        )


def _names(body: object) -> list[str] | None:
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        return None
    out = []
    for m in models:
        name = (m.get("name") or m.get("model")) if isinstance(m, dict) else None
        if isinstance(name, str) and name:
            out.append(name)
    return out
