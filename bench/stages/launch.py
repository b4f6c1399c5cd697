"""``python -m bench.stages.launch OPOD-ARGS...``: the ``opod`` command in this process, with a profiling window.

The bench opens and closes the window with SIGUSR1: the first signal reads the request file named by
``STAGES_PROFILE_REQUEST`` (the stats file to write and the profiler's clock), starts ``cProfile`` on the
main thread (the event loop's), and the next one stops it and writes the stats. Only the measured requests
are profiled, never the start-up; with no window open the profiler costs nothing.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
"""The profiler's clocks: CPU time of the event loop's thread, or elapsed time while a function is on the stack."""


class Window:
    def __init__(self, request_file: Path) -> None:
        self.request_file = request_file
        self.profile: cProfile.Profile | None = None
        self.out = Path()

    def toggle(self, signum: int, frame: FrameType | None) -> None:
        if self.profile is None:
            asked = json.loads(self.request_file.read_text())
            self.out = Path(asked["out"])
            self.profile = cProfile.Profile(CLOCKS[asked["clock"]])
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
    from opod.cli.main import run

    sys.argv = ["opod", *sys.argv[1:]]
    run()


if __name__ == "__main__":
    main()
