"""``python -m bench compare``: direct, opod with every governance area on, and sglang-router, side by side.

Modules: ``governance`` (turning every area on with ``opod ctl``; the guardrail is the settings' guard policy,
or for ``--path opod-webhook`` the policy file's webhook), ``runner`` (the two fleets and the interleaved
rounds) and ``report``. The fleet, the peers, the load generator and the metrics are bench/routing's.
"""

from bench.compare.cli import command

__all__ = ["command"]
