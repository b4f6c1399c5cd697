"""begin() and end() run on the request path: they must cost microseconds, not a database round trip."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from opod.ledger import Ledger
from opod.store import Store

ROUTE = {"worker": "node-a", "reason": "prefix", "class": "standard"}


def test_begin_and_end_cost_well_under_a_millisecond(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'opod.db'}")  # begin and end never touch it
    ledger = Ledger.open(store, tmp_path, boot=1)
    try:
        begins, ends = [], []
        # CPU time of this thread: the suite's other processes share the cores, and waiting for one is not the cost.
        for i in range(3000):
            started = time.thread_time()
            ticket = ledger.begin(
                request_id=f"req-{i}", api_key_id="k_1", user_id="u_1", model="smollm2-135m-instruct", protocol="openai"
            )
            middle = time.thread_time()
            ledger.end(
                ticket,
                outcome="ok",
                prompt_tokens=812,
                completion_tokens=128,
                latency_ms=930,
                ttft_ms=41,
                node_id="node-a",
                route=ROUTE,
            )
            begins.append(middle - started)
            ends.append(time.thread_time() - middle)
        for name, costs in (("begin", begins), ("end", ends)):
            median = statistics.median(costs)
            p99 = statistics.quantiles(costs, n=100)[98]
            # Typically ~10 µs each; the bounds leave room for a loaded CI machine.
            assert median < 100e-6, f"{name}: median {median * 1e6:.1f} µs"
            assert p99 < 1e-3, f"{name}: p99 {p99 * 1e6:.1f} µs"
    finally:
        ledger.close()
        store.close()
