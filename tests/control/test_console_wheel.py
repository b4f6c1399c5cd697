"""The console's templates, script and style sheet ship in the wheel: a leader installed from it serves its pages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "src" / "opod" / "control" / "console"


def test_a_built_wheel_holds_every_template_and_static_file(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("opod-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        f"opod/control/console/{path.relative_to(CONSOLE).as_posix()}"
        for folder in ("templates", "static")
        for path in (CONSOLE / folder).rglob("*")
        if path.is_file()
    }
    assert {"opod/control/console/static/console.js", "opod/control/console/templates/base.html"} <= wanted
    assert wanted <= names, sorted(wanted - names)
