"""One model's engine on a worker, as the engine manager (``opod.worker.engines``) keeps it: its state, its
process, its place in a replica, and what it was started with."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from opod.contract import nodeapi
from opod.engines.base import EngineDriver, LaunchSpec, LoadSample, MetricsState
from opod.worker.kvlistener import KVEventListener
from opod.worker.multinode import Ranks


@dataclass(slots=True)
class ModelEngine:
    model_id: str
    driver: EngineDriver
    state: str = "fetching"
    """fetching → starting → serving; failed or stopped when it ends."""
    detail: str = ""
    port: int = 0
    spec: LaunchSpec | None = None
    process_id: str = ""
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    metrics: MetricsState | None = None
    sample: LoadSample | None = None
    task: asyncio.Task[None] | None = None
    kv: KVEventListener | None = None
    """The engine's KV-cache event listener, when its driver publishes events."""
    replica: str = ""
    profile: int = 0
    fingerprint: str = ""
    """The reconciler's replica id, profile index and definition digest for this engine (empty: a pinned load)."""
    devices: list[int] | None = None
    """The GPUs the leader gave this replica here (``CUDA_VISIBLE_DEVICES``); ``None`` = none said."""
    env: dict[str, str] = field(default_factory=dict)
    """The replica's own environment for the engine (its profile's, and its devices)."""
    ranks: Ranks | None = None
    """Its place in a replica across nodes; ``None`` on one node."""
    extra_argv: list[str] = field(default_factory=list)
    """Added to the driver's command line: the distributed runtime's flags."""

    @property
    def follower(self) -> bool:
        """A rank other than 0 of a replica across nodes: it runs its part and serves nothing."""
        return self.ranks is not None and self.ranks.rank > 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def enter(self, state: str, detail: str = "") -> None:
        self.state = state
        self.detail = detail
        self.since = datetime.now(UTC)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(port: int) -> bool:
    """True when something on this machine holds ``port`` on loopback (a listener, or a client's source port)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def one_word(states: Sequence[tuple[ModelEngine, nodeapi.EngineState | None]], serving: bool) -> nodeapi.EngineState:
    """One word for a worker's engines, from each engine and its process's word (``None`` while fetching).

    ``serving`` while any engine serves (``serving``), or none is running (an idle worker takes loads);
    ``crash-looping`` or ``starting`` when that is the best any engine can say. Never ``stopped`` while the
    worker lives: that word is the worker's goodbye. A model that failed to load is reported in
    ``load_errors`` and named in the detail.
    """
    problems = [
        e.detail
        for e, w in states
        if e.state == "failed" or (w is not None and w.state in ("crash-looping", "stopped"))
    ]
    if serving or not states:
        return nodeapi.EngineState(state="serving", detail="; ".join(problems)[:300])
    for _engine, word in states:
        if word is not None and word.state == "crash-looping":
            return word
    busy = next((e for e, _ in states if e.state in ("fetching", "starting")), None)
    if busy is not None:
        return nodeapi.EngineState(
            state="starting", since=busy.since.strftime("%Y-%m-%dT%H:%M:%SZ"), detail=busy.detail[:300]
        )
    return nodeapi.EngineState(state="serving", detail="; ".join(problems)[:300])
