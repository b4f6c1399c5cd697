"""``opod up`` as a user meets it in a log: whole lines, one-line refusals, no tracebacks."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.ports import free_port
from tests.support.opod_process import OPOD, Leader, clean_env, http


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    # COLUMNS empty: the width a log or a pipe gets when nobody set one.
    started = Leader(tmp_path_factory.mktemp("up-cli") / "home", worker=False, env={"COLUMNS": ""})
    started.process.wait_for_line("try, once it is served", timeout=30)
    yield started
    started.process.stop()


def _up(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*OPOD, "up", "--no-worker", "--no-default-models", *args]
    return subprocess.run(argv, env=clean_env(home, COLUMNS=""), capture_output=True, text=True, timeout=60)


def test_the_banner_is_not_wrapped_in_a_log_and_its_curl_runs_as_copied(leader: Leader) -> None:
    line = leader.process.wait_for_line("try, once it is served")
    command = line.split("try, once it is served: ", 1)[1]
    argv = shlex.split(command)
    assert argv[0] == "curl" and argv[1] == f"http://127.0.0.1:{leader.port}/v1/chat/completions", argv
    assert argv[-2] == "-d" and argv[-1].endswith('"content": "Hello"}]}'), argv
    banner = leader.process.wait_for_line("OpenAI API on")
    assert banner.endswith("/api/v1"), "the first line is whole"


def test_a_second_up_on_the_same_home_is_one_line_naming_the_home_and_the_holder(leader: Leader) -> None:
    pid = leader.process.proc.pid
    for ports in ((free_port(), free_port()), (leader.port, leader.admin_port)):
        result = _up(leader.home, "--listen", f"127.0.0.1:{ports[0]}", "--admin-listen", f"127.0.0.1:{ports[1]}")
        assert result.returncode == 1, result
        lines = (result.stdout + result.stderr).strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"the opod home {leader.home.resolve()} is in use by opod up (pid {pid})" in lines[0]
        assert "OPOD_HOME=" in lines[0] and f"kill {pid}" in lines[0]
    status, _, _ = http("GET", leader.url + "/healthz")
    assert status == 200, "the running leader is untouched"


def test_a_port_in_use_is_one_line_naming_the_option(leader: Leader, tmp_path: Path) -> None:
    result = _up(
        tmp_path / "other", "--listen", f"127.0.0.1:{leader.port}", "--admin-listen", f"127.0.0.1:{free_port()}"
    )
    assert result.returncode == 1
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(rf"cannot listen on 127\.0\.0\.1:{leader.port}: the port is in use.*--listen", lines[0]), lines[0]


def test_the_admin_api_refusal_says_where_the_admin_key_is(leader: Leader) -> None:
    env = clean_env(leader.home, OPOD_ADMIN_URL=leader.admin_url, OPOD_ADMIN_KEY="sk-not-it")
    result = subprocess.run([*OPOD, "token", "ls"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "(HTTP 401)" in result.stderr, result.stderr
    assert "admin.key" in result.stderr and "create one with `opod token create`" not in result.stderr
    status, _, body = http("GET", leader.url + "/admin/v1/nodes", key="sk-not-it")
    message = body["error"]["message"]
    assert status == 401 and "admin.key" in message and "create one with `opod token create`" not in message


def test_up_says_nothing_alarming_about_its_models_before_its_own_worker_has_registered(tmp_path: Path) -> None:
    started = Leader(tmp_path / "home", extra=["--engine", "sim"])
    try:
        started.process.wait_for_line("smollm2-135m-instruct: serving on", timeout=60)
        started.process.wait_for_line("all-minilm-l6-v2: serving on", timeout=30)
    finally:
        started.process.stop()
    lines = started.process.lines
    registered = next(i for i, line in enumerate(lines) if "opod.worker: registered with" in line)
    said = [line for line in lines if line.startswith(("smollm2-135m-instruct: ", "all-minilm-l6-v2: "))]
    assert not any("cannot be placed" in line for line in said), started.process.output
    assert all(lines.index(line) > registered for line in said), started.process.output
