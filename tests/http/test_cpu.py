"""The leader's event loop on one core: where ``OPOD_LOOP_CPU`` puts it, and that what it starts runs free."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from opod.http import cpu
from tests.support.opod_process import Leader, http, sim_worker, wait_until

TWO = frozenset({0, 1})


@pytest.mark.parametrize(
    ("setting", "allowed", "running_on", "taken", "pinned"),
    [
        (None, TWO, 1, {}, 1),  # where it runs, when no CPU is taken
        ("auto", TWO, 0, {}, 0),
        ("AUTO", frozenset({2, 3, 5}), 5, {}, 5),
        (None, TWO, 1, {1: 1}, 0),  # another leader's loop holds CPU 1: the free one
        (None, frozenset({0, 1, 2}), 2, {0: 1, 1: 2, 2: 1}, 2),  # a least taken one, its own among them
        (None, frozenset({0, 1, 2}), 1, {0: 1, 1: 2, 2: 1}, 0),
        (None, TWO, None, {}, 0),  # the CPU it runs on unknown: the lowest of the least taken
        ("1", TWO, 0, {1: 3}, 1),  # the operator's number stands
    ],
)
def test_the_loop_goes_to_the_cpu_the_setting_and_the_other_pinned_processes_leave(
    setting: str | None, allowed: frozenset[int], running_on: int | None, taken: dict[int, int], pinned: int
) -> None:
    placement = cpu.plan(setting, allowed, running_on, taken)
    assert placement.cpu == pinned
    assert placement.said == f"event loop pinned to CPU {pinned} (OPOD_LOOP_CPU=off lets it move)"


@pytest.mark.parametrize(
    ("setting", "allowed", "said", "mistaken"),
    [
        ("off", TWO, "OPOD_LOOP_CPU=off", False),
        ("OFF", TWO, "OPOD_LOOP_CPU=OFF", False),
        (None, frozenset({3}), "may run on one CPU only", False),
        ("3", TWO, "OPOD_LOOP_CPU=3: this process may run on CPUs 0,1 only", True),
        ("fast", TWO, "OPOD_LOOP_CPU='fast' is neither auto, off nor a CPU's number", True),
        ("-1", TWO, "is neither auto, off nor a CPU's number", True),
    ],
)
def test_a_loop_left_free_says_why(setting: str | None, allowed: frozenset[int], said: str, mistaken: bool) -> None:
    placement = cpu.plan(setting, allowed, 0)
    assert placement.cpu is None and placement.mistaken is mistaken
    assert placement.said.startswith("event loop free to move between CPUs (") and said in placement.said


def _machine_cpus() -> frozenset[int]:
    if not sys.platform.startswith("linux"):
        pytest.skip("a thread's CPUs are pinned on Linux only")
    cpus = frozenset(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"this machine gives the tests one CPU ({sorted(cpus)}): nothing to choose between")
    return cpus


def _cpus_of(pid: int, tid: int | None = None) -> frozenset[int]:
    status = Path(f"/proc/{pid}/task/{tid or pid}/status").read_text()
    listed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", status, re.MULTILINE)
    assert listed is not None, status
    return _parse_list(listed.group(1))


def _parse_list(listed: str) -> frozenset[int]:
    """``0-2,5`` → {0, 1, 2, 5}, as /proc writes a CPU list."""
    out: set[int] = set()
    for part in listed.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


def test_a_process_pinned_to_one_cpu_is_counted_on_it() -> None:
    cpus = _machine_cpus()
    target = max(cpus)
    before = cpu.taken_cpus()[target]
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, sys, time; os.sched_setaffinity(0, {{{target}}}); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"1"
        assert cpu.taken_cpus()[target] == before + 1
        assert cpu.taken_cpus(own=child.pid)[target] == before  # itself left out, as a leader leaves itself out
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("setting", "computes_on_cpu", "allowed", "loops", "given"),
    [
        (None, False, frozenset(range(8)), frozenset({3}), frozenset(range(8)) - {3}),  # a GPU engine, 8 CPUs
        ("apart", False, frozenset({0, 1, 2, 3}), frozenset({0, 2}), frozenset({1, 3})),  # two leaders' loops
        (None, False, frozenset({0, 1}), frozenset({1}), frozenset({0})),  # two CPUs: the one the loop leaves
        ("sideways", False, frozenset({0, 1}), frozenset({1}), frozenset({0})),  # a mistaken setting is apart's
        ("APART", False, frozenset({0, 1}), frozenset({0, 1}), None),  # nothing left apart: every CPU
        ("all", False, frozenset({0, 1}), frozenset({1}), None),
        (None, True, frozenset(range(8)), frozenset({3}), None),  # llama.cpp computes on the CPU: all of them
        ("all", False, frozenset(range(8)), frozenset({3}), None),
        (None, False, frozenset(range(8)), frozenset(), None),  # no leader's loop pinned here
        (None, False, frozenset({4, 5, 6, 7}), frozenset({1}), None),  # a loop on a CPU the worker does not have
    ],
)
def test_an_engine_is_kept_off_leaders_loop_cpus_where_the_setting_and_the_machine_allow(
    setting: str | None,
    computes_on_cpu: bool,
    allowed: frozenset[int],
    loops: frozenset[int],
    given: frozenset[int] | None,
) -> None:
    assert cpu.engine_plan(setting, computes_on_cpu, allowed, loops) == given


@pytest.mark.parametrize("setting", [None, "all"])
def test_opod_up_pins_its_loop_its_engine_stays_off_it_where_it_may_and_its_ledger_writer_runs_free(
    tmp_path: Path, setting: str | None
) -> None:
    cpus = _machine_cpus()
    leader = Leader(
        tmp_path / "home", extra=["--engine", "sim"], env={} if setting is None else {cpu.ENGINE_SETTING: setting}
    )
    try:
        said = leader.process.wait_for_line("opod.cpu: event loop pinned to CPU", timeout=30)
        pinned = int(re.search(r"pinned to CPU (\d+)", said).group(1))  # type: ignore[union-attr]
        pid = leader.process.proc.pid
        assert _cpus_of(pid) == {pinned}, "the loop's thread is not on the CPU the log names"
        assert Path(f"/proc/{pid}/comm").read_bytes().strip() == cpu.LEADER_NAME
        assert pinned in cpu.leader_loop_cpus()
        leader.process.wait_for_line("smollm2-135m-instruct: serving on", timeout=60)
        engines = leader.process.children()
        assert engines, "the local worker started no engine"
        # Off the loop's CPU; on every CPU where other leaders' loops (the suite's, side by side) hold the rest.
        engine_cpus = {_cpus_of(engine) for engine in engines}
        assert all(on == cpus or pinned not in on for on in engine_cpus), engine_cpus
        if setting == "all":
            assert engine_cpus == {cpus}, engine_cpus
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        status, _, answer = http("POST", leader.url + "/v1/chat/completions", body, key=leader.key)
        assert status == 200, answer

        def others_free() -> bool:
            threads = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
            return len(threads) > 0 and all(_cpus_of(pid, t) == cpus for t in threads)

        def named(tid: int) -> bytes:
            return Path(f"/proc/{pid}/task/{tid}/comm").read_bytes().strip()

        # The ledger's writer, the store's thread and the loop's executor started after the pin: none kept it.
        wait_until(others_free, 10, "every thread but the loop's on every CPU")
        # Each goes by its own name where top -H shows it, not the loop's that it was made with.
        others = {named(int(t)) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid}
        assert cpu.LEADER_NAME not in others and any(n.startswith(b"opod ledger") for n in others), others
    finally:
        leader.process.stop()


def test_a_joined_worker_on_the_leader_s_machine_keeps_itself_and_its_engine_off_the_loop_s_cpu(tmp_path: Path) -> None:
    """``opod join`` beside a leader: its heartbeats and the KV events its engine publishes, like the engine's own
    work, take the leader's caches."""
    cpus = _machine_cpus()
    leader = Leader(tmp_path / "leader", worker=False)
    worker = None
    try:
        said = leader.process.wait_for_line("opod.cpu: event loop pinned to CPU", timeout=30)
        pinned = int(re.search(r"pinned to CPU (\d+)", said).group(1))  # type: ignore[union-attr]
        worker = sim_worker(leader, tmp_path / "worker", "n_apart")
        worker.wait_for_line("registered with", 60)
        wait_until(lambda: bool(leader.served()), 60, "the worker's model served")
        assert pinned in cpu.leader_loop_cpus()
        pid = worker.proc.pid
        threads = {_cpus_of(pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}
        assert len(threads) == 1, threads  # the worker's threads together
        (on,) = threads
        # Off the loop's CPU, or on every CPU where other leaders' loops (the suite's, side by side) hold the rest.
        assert on == cpus or pinned not in on, on
        engines = worker.children()
        assert engines, "the worker started no engine"
        for engine in engines:
            assert _cpus_of(engine) == cpus or pinned not in _cpus_of(engine), f"engine {engine} on the loop's CPU"
    finally:
        if worker is not None:
            worker.stop()
        leader.process.stop()


KEEP_APART = """
import json, os, threading, time
from opod.http import cpu
threading.Thread(target=time.sleep, args=(5,), daemon=True).start()  # a thread that is there before the move
whole = frozenset(os.sched_getaffinity(0))
before = cpu.leader_loop_cpus()
placed = cpu.keep_worker_apart()
after = cpu.leader_loop_cpus()
threads = sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})
print(json.dumps({"whole": sorted(whole), "before": sorted(before), "after": sorted(after),
                  "placed": None if placed is None else sorted(placed), "threads": threads}))
"""


def test_a_worker_keeping_apart_moves_every_thread_off_the_leaders_loops_it_finds(tmp_path: Path) -> None:
    cpus = _machine_cpus()
    target = max(cpus)
    leader = subprocess.Popen(  # a process as a leader's loop looks: named opod-leader, pinned to one CPU
        [
            sys.executable,
            "-c",
            f"import ctypes, os, time; os.sched_setaffinity(0, {{{target}}}); "
            f"ctypes.CDLL(None).prctl(15, ctypes.c_char_p({cpu.LEADER_NAME!r}), 0, 0, 0); print(1, flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == b"1"
        for _ in range(5):  # the suite's own leaders come and go meanwhile: a run that saw them move is asked again
            env = {k: v for k, v in os.environ.items() if k != cpu.ENGINE_SETTING}  # the default
            done = subprocess.run(
                [sys.executable, "-c", KEEP_APART], env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            seen = json.loads(done.stdout)
            if seen["before"] == seen["after"]:
                break
        assert target in seen["before"]
        whole, loops = frozenset(seen["whole"]), frozenset(seen["before"])
        placed = cpu.engine_plan(None, False, whole, loops)
        assert seen["placed"] == (None if placed is None else sorted(placed))
        assert seen["threads"] == [sorted(placed or whole)]  # every thread, the one made before the move included
    finally:
        leader.kill()
        leader.wait()


def test_opod_up_with_the_loop_left_free_says_so(tmp_path: Path) -> None:
    cpus = _machine_cpus()
    leader = Leader(tmp_path / "home", worker=False, env={"OPOD_LOOP_CPU": "off"})
    try:
        leader.process.wait_for_line("event loop free to move between CPUs (OPOD_LOOP_CPU=off)", timeout=30)
        assert _cpus_of(leader.process.proc.pid) == cpus
    finally:
        leader.process.stop()


def test_a_command_the_pinned_loop_runs_to_its_end_gets_every_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine build or upgrade (``opod.worker.installs.run``) is started from the loop's thread itself."""
    from opod.worker import installs

    cpus = _machine_cpus()
    monkeypatch.setattr(cpu, "_free", None)  # this test's loop pins only its own thread; the module forgets it after
    seen: dict[str, object] = {}

    async def pinned_then_run() -> None:
        placement = await cpu.pin_event_loop()
        seen["loop"] = frozenset(os.sched_getaffinity(0))
        seen["placement"] = placement
        seen["outcome"] = await installs.run(["grep", "Cpus_allowed_list", "/proc/self/status"], label="test")

    runner = threading.Thread(target=lambda: asyncio.run(pinned_then_run()))
    runner.start()
    runner.join(30)
    placement = seen["placement"]
    assert isinstance(placement, cpu.Placement) and placement.cpu is not None, placement
    assert seen["loop"] == {placement.cpu}
    outcome = seen["outcome"]
    assert isinstance(outcome, installs.Outcome) and outcome.ok, outcome
    listed = outcome.last.split(":", 1)[1].strip()
    assert _parse_list(listed) == cpus, f"the command ran on {listed}"
