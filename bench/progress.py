"""A benchmark's steps as progress bars: each step says its size, and advances one unit at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Advance = Callable[[], None]
Step = Callable[[str, int], Advance]
"""(description, units) → the call that advances that step's bar by one."""
Say = Callable[[str], None]


@contextmanager
def steps(console: Console) -> Iterator[tuple[Step, Say]]:
    """A step maker and a way to print above the bars, while they show."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:

        def step(description: str, total: int) -> Advance:
            task = progress.add_task(description, total=max(total, 1))
            return lambda: progress.advance(task)

        yield step, progress.console.print
