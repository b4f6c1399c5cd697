"""``collector_paused``: the leader's and a worker's imports run without the cyclic collector, which comes back after."""

from __future__ import annotations

import gc

import pytest

from opod.cli.common import collector_paused


def test_the_collector_is_off_while_importing_and_on_again_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_comes_back_when_an_import_fails() -> None:
    with pytest.raises(ImportError), collector_paused():
        import opod.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert gc.isenabled()


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
