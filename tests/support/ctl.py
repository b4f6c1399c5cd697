"""A leader for ``opod ctl`` tests run in process: one simulator worker joining it, one model placed there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from opod.cli.common import err, out
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, sim_worker


@contextmanager
def serving_leader(root: Path, model: str, node_id: str, **worker_env: str) -> Iterator[InProcessLeader]:
    """A leader in ``root``, a simulator worker ``node_id`` joining it (``worker_env`` added to its environment) and
    ``model`` being placed on it while the first tests run; the commands' tables 200 columns wide, never folded to a
    test runner's 80. Everything is stopped, and the widths put back, after."""
    up = InProcessLeader(root / "home")
    widths = out.width, err.width
    out.width = err.width = 200
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(up, root / "worker", node_id, **worker_env)
        status, body = up.admin(
            "POST", "/api/v1/models", {"name": model, "profiles": [{"engine": "sim"}], "scaling": {"min": 1, "max": 1}}
        )
        assert status == 200, body
        yield up
    finally:
        out.width, err.width = widths
        if worker is not None:
            worker.stop()
        up.stop()
