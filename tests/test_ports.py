"""The port picker the tests and the benchmarks share: a harness that draws several ports before binding any
gets different ones, and none where the kernel hands out client connections' source ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ports import REMEMBERED, free_port, port_range, run_range


def test_ports_drawn_before_any_is_bound_are_all_different() -> None:
    low, high = port_range()[0], run_range()[0]
    drawn = [free_port() for _ in range(REMEMBERED)]
    assert len(set(drawn)) == len(drawn), "a leader's public, admin and worker ports must differ"
    assert all(low <= port < high for port in drawn)


def test_ports_are_below_the_kernels_ephemeral_range() -> None:
    """A load generator opens thousands of connections; none may take the port a server is about to bind."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ranges.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: not Linux, the ephemeral range is unknown")
    ephemeral_low = int(ranges.read_text().split()[0])
    assert all(free_port() < ephemeral_low for _ in range(50))
