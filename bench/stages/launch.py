"""``python -m bench.stages.launch OPOD-ARGS...``: the ``opod`` command in this process, with a profiling window.

The bench opens and closes the window with SIGUSR1: the first signal reads the request file named by
``STAGES_PROFILE_REQUEST`` (the stats file to write and the profiler's clock), starts ``cProfile`` on the
main thread (the event loop's), and the next one stops it and writes the stats. Only the measured requests
are profiled, never the start-up; with no window open the profiler costs nothing. The clock ``lines``
counts the lines of Python the main thread runs instead (:class:`LineCount`, for ``python -m bench lines``).
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
"""The profiler's clocks: CPU time of the event loop's thread, or elapsed time while a function is on the stack."""


class LineCount:
    """The lines of Python the thread that enables it runs until disabled, each by where it is: its file, its
    function's name and first line, and its own line. ``sys.settrace`` calls it at every line, so what it
    watches runs many times slower; the count does not depend on that."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, int, int]] = Counter()

    def enable(self) -> None:
        sys.settrace(self._called)

    def _called(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._ran  # each frame's lines, a coroutine's each time it resumes

    def _ran(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            code = frame.f_code
            self.counts[code.co_filename, code.co_qualname, code.co_firstlineno, frame.f_lineno] += 1
        return self._ran

    def disable(self) -> None:
        sys.settrace(None)

    def dump_stats(self, path: Path) -> None:
        path.write_text(json.dumps([[*where, count] for where, count in self.counts.items()]))


class Window:
    def __init__(self, request_file: Path) -> None:
        self.request_file = request_file
        self.profile: cProfile.Profile | LineCount | None = None
        self.out = Path()

    def toggle(self, signum: int, frame: FrameType | None) -> None:
        if self.profile is None:
            asked = json.loads(self.request_file.read_text())
            self.out = Path(asked["out"])
            clock = asked["clock"]
            self.profile = LineCount() if clock == "lines" else cProfile.Profile(CLOCKS[clock])
            self.profile.enable()
            return
        profile, self.profile = self.profile, None
        profile.disable()
        written = self.out.with_name(self.out.name + ".part")
        profile.dump_stats(written)
        os.replace(written, self.out)  # whole or absent: the bench waits for this name


def main() -> None:
    window = Window(Path(os.environ["STAGES_PROFILE_REQUEST"]))
    signal.signal(signal.SIGUSR1, window.toggle)
    try:
        from opod.cli.entry import run  # the command as users start it: the leader's heap chosen first
    except ImportError:  # a base checkout from before that entry point (stages-ab)
        from opod.cli.main import run

    sys.argv = ["opod", *sys.argv[1:]]
    run()


if __name__ == "__main__":
    main()
