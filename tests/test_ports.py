"""The tests' port picker: a helper that draws several ports before binding any gets different ones."""

from __future__ import annotations

from tests.support.ports import REMEMBERED, free_port, port_range, run_range


def test_ports_drawn_before_any_is_bound_are_all_different() -> None:
    low, high = port_range()[0], run_range()[0]
    drawn = [free_port() for _ in range(REMEMBERED)]
    assert len(set(drawn)) == len(drawn), "a leader's public, admin and worker ports must differ"
    assert all(low <= port < high for port in drawn)
