"""``POST /api/v1/nodes/{id}/upgrade`` on a real leader and a real ``opod join`` worker: the worker installs the
wanted release and restarts into it with its engine kept serving; a release that cannot be installed is reported
on the node view and the worker goes on with the one it runs.

The release is a real wheel of this project with its version set to 99.0.0 (built here, as a wheel is laid
out, so no build backend is needed), installed by pip from a folder into a ``PYTHONPATH`` the worker reads.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import (
    OpodProcess,
    alive,
    descendants,
    opod_cli,
    remove_home,
    sim_worker,
    wait_until,
)

openai = pytest.importorskip("openai")

MODEL = "sim-chat"
NEW = "99.0.0"
MISSING = "98.7.6"
SRC = Path(__file__).resolve().parents[2] / "src" / "opod"


def build_wheel(folder: Path, version: str) -> Path:
    """A wheel of ``src/opod`` as ``opod==version``: the package, its metadata and its RECORD."""
    dist = f"opod-{version}.dist-info"
    wheel = folder / f"opod-{version}-py3-none-any.whl"
    files: list[tuple[str, bytes]] = [
        (f"opod/{path.relative_to(SRC).as_posix()}", path.read_bytes())
        for path in sorted(SRC.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]
    files.append((f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: opod\nVersion: {version}\n".encode()))
    files.append(
        (f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: opod-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    )
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


def node_view(leader: Leader, node: str) -> dict:
    status, body = leader.admin("GET", "/api/v1/nodes")
    assert status == 200, body
    assert isinstance(body, list)
    return next(n for n in body if n["id"] == node)


def chat(leader: Leader) -> str:
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    return answer.choices[0].message.content or ""


def test_a_node_upgrades_to_the_wanted_release_with_its_engine_kept_and_reports_one_it_cannot_install(
    tmp_path: Path,
) -> None:
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    site.mkdir()
    build_wheel(wheels, NEW)
    command = (
        f"{{python}} -m pip install --no-deps --no-index --no-compile --disable-pip-version-check --find-links {wheels} "
        f"--target {site} --upgrade opod=={{version}}"
    )
    leader = Leader(tmp_path / "leader")
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(leader, tmp_path / "worker", "n_up", PYTHONPATH=str(site), OPOD_UPGRADE_COMMAND=command)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        engines = descendants(worker.proc.pid)
        before = node_view(leader, "n_up")
        assert before["agent_version"] != NEW and "agent_upgrade" in before["features"], before

        # A release that does not exist: the node view says why, and the worker runs on with its release.
        status, body = leader.admin("POST", "/api/v1/nodes/n_up/upgrade", {"version": MISSING})
        assert status == 200 and body == {"node": "n_up", "version": MISSING}, body
        failed = wait_until(
            lambda: [
                w
                for w in node_view(leader, "n_up").get("warnings", [])
                if w.startswith(f"upgrade to {MISSING} failed: ")
            ],
            60,
            "the failed upgrade's warning",
        )
        assert "No matching distribution found for opod==98.7.6" in failed[0], failed
        view = node_view(leader, "n_up")
        assert view["agent_version"] == before["agent_version"], view
        assert worker.proc.poll() is None and "restarting as a new process" not in worker.output
        assert chat(leader)

        # The release that exists: installed, the worker restarts into it, and its engine never stopped.
        status, body = leader.admin("POST", "/api/v1/nodes/n_up/upgrade", {"version": NEW})
        assert status == 200, body
        wait_until(
            lambda: node_view(leader, "n_up")["agent_version"] == NEW,
            60,
            f"the node to run {NEW}; output:\n{worker.output}",
        )
        view = node_view(leader, "n_up")
        assert not [w for w in view.get("warnings", []) if "upgrad" in w or NEW in w], view
        assert (site / f"opod-{NEW}.dist-info").is_dir()
        assert worker.proc.poll() is None, worker.output
        assert descendants(worker.proc.pid) == engines and all(alive(pid) for pid in engines), worker.output
        wait_until(lambda: MODEL in leader.served(), 30, "the model to be served")
        assert chat(leader)
    finally:
        if worker is not None:
            worker.stop()
        leader.stop()
        remove_home(tmp_path)


def test_the_upgrade_command_is_split_without_a_shell_and_filled_in() -> None:
    from opod.worker.upgrade import command_for

    def given(text: str) -> dict[str, str]:
        return {"OPOD_UPGRADE_COMMAND": text}

    assert command_for("0.7.0", given("{python} -m pip install --upgrade 'opod=={version}'")) == [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--upgrade",
        "opod==0.7.0",
    ]
    assert command_for("1.0", given("echo {version}; date")) == [
        "echo",
        "1.0;",
        "date",
    ]  # no shell: the ; is a plain character
    assert command_for("1.0", {}) == [sys.executable, "-m", "pip", "install", "--upgrade", "opod==1.0"]
    with pytest.raises(ValueError, match=r"OPOD_UPGRADE_COMMAND=.*only \{python\} and \{version\} in braces"):
        command_for("1.0", given("pip install {pkg}"))
