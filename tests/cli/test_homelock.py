"""The home lock: one process per opod home, released by the kernel however the holder ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from opod.cli import homelock

HOLD = "import sys, time; from pathlib import Path; from opod.cli import homelock; homelock.hold(Path(sys.argv[1]), 'opod up'); print('held', flush=True); time.sleep(60)"


def test_a_home_held_elsewhere_is_refused_naming_the_pid_and_freed_when_the_holder_is_killed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(home)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(homelock.HomeInUse) as caught:
            homelock.hold(home, "opod join")
        message = str(caught.value)
        assert f"the opod home {home.resolve()} is in use by opod up (pid {holder.pid})" in message
        assert f"kill {holder.pid}" in message and "OPOD_HOME=/another/dir opod join" in message
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    homelock.hold(home, "opod up")  # kill -9 left no stale lock behind
    try:
        homelock.hold(home, "opod up")  # the same process again: already held
        assert (home / homelock.LOCK_FILE).read_text().startswith(f"{os.getpid()} ")
    finally:
        homelock.release(home)
