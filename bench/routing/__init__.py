"""``python -m bench routing``: opod's routing against direct, LiteLLM and the Rust routers, on the same simulator engines.

Modules: ``fleet`` (the opod leader, workers and their engines), ``peers`` (the
peers' installs and processes), ``workloads`` (the seeded requests), ``oracle``
(the best cache-hit rate a router could reach), ``load`` (the load generator),
``metrics``, ``runner`` (paths × workloads), ``goals`` and ``report``.
"""

from bench.routing.cli import command

__all__ = ["command"]
