"""An engine's port taken by another program between the worker's choice and the engine's bind.

A loopback client draws its source port from the same range the worker chooses engine ports from, so
now and then the chosen port is gone before the engine binds it. Restarting the engine on that port
would only crash-loop; the engine manager (:mod:`opod.worker.engines`) starts it again on a new port
instead, a few times at most.
"""

from __future__ import annotations

import dataclasses
import logging

from opod.worker.model_engine import ModelEngine, free_port, port_taken

log = logging.getLogger("opod.worker")

PORT_MOVES = 3
"""How many times one start moves its engine to a new port when the chosen one was taken before the engine bound it."""


def lost_its_port(engine: ModelEngine) -> bool:
    """The engine's process ended and its HTTP port is held by another program (a follower rank has no port)."""
    return not engine.follower and engine.port > 0 and port_taken(engine.port)


def move_to_a_new_port(engine: ModelEngine) -> None:
    """Give ``engine`` a free port, in its launch spec too, for its next start."""
    assert engine.spec is not None
    taken, engine.port = engine.port, free_port()
    engine.spec = dataclasses.replace(engine.spec, port=engine.port)
    log.warning("%s: port %d was taken before the engine bound it; starting on %d", engine.model_id, taken, engine.port)
