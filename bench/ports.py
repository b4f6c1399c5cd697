"""Free loopback ports for the servers the benchmarks and the tests start.

Ports come from 10000-32000, below the ephemeral ports Linux hands to ``bind(0)`` and to outgoing
connections (32768 and up), so a load generator's thousands of client connections never take a port
a server was about to bind, and no engine's own ``bind(0)`` lands on one. Under pytest-xdist each
worker draws from its own slice (``gw0``, ``gw1``, ...): a port one test frees while its leader
restarts cannot be handed to another worker's test.

A port is never handed to the same process twice among its last :data:`REMEMBERED`: a harness that
asks for three ports before it starts anything (a leader's public, admin and worker listeners) gets
three different ones.
"""

from __future__ import annotations

import os
import random
import socket
from collections import deque

LOW, HIGH = 10000, 32000
_pick = random.Random()
REMEMBERED = 1000
_handed: deque[int] = deque(maxlen=REMEMBERED)
"""The last ports :func:`free_port` gave this process."""


def port_range() -> tuple[int, int]:
    """This process's slice: all of it outside pytest-xdist, one part per xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (HIGH - LOW) // max(count, 1)
    return LOW + index * width, LOW + (index + 1) * width


def run_range() -> tuple[int, int]:
    """The last quarter of this process's slice, kept for runs of consecutive ports (a gang's parts): single ports
    never come from it, so one drawn for a leader cannot land inside a run handed out a moment before."""
    low, high = port_range()
    return high - (high - low) // 4, high


def free_port() -> int:
    """A port of this process's slice (outside its runs' quarter) that nothing listens on now and that
    this process was not given lately: a port drawn but not yet bound is not drawn again."""
    low, high = port_range()[0], run_range()[0]
    for _ in range(500):
        port = _pick.randrange(low, high)
        if port in _handed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.append(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}-{high} after 500 tries")
