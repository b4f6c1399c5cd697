"""``python -m bench fleet-scale``: one leader with 100 to 1,000 simulated nodes that only heartbeat (issue 21, "Scale").

Modules: ``shape`` (the nodes' declared inventories and the models), ``swarm`` (the simulated
nodes: one asyncio process speaking the worker protocol), ``measure`` (CPU from /proc, the
admin API's latency), ``planner`` (the placement work alone, in process), ``runner`` (one
fleet size end to end), ``report`` and ``cli``.
"""

from bench.fleet_scale.cli import command

__all__ = ["command"]
