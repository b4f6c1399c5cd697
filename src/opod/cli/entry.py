"""The ``opod`` command's entry point: the leader's heap chosen first (:mod:`opod.cli.heap`), then the commands."""

from __future__ import annotations

import sys

from opod.cli import heap


def run() -> None:
    heap.prepare(sys.argv[1:])
    from opod.cli.main import run as commands  # after: a leader that restarts has imported next to nothing

    commands()
