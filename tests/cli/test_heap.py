"""The leader's heap on transparent huge pages: when ``opod up`` restarts itself on it, and what it leaves alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from opod.cli import heap
from tests.support.opod_process import Leader

GLIBC, THP = "glibc 2.36", "always [madvise] never"


def planned(environ: dict[str, str] | None = None, **facts: object) -> dict[str, str] | heap.Heap:
    given: dict[str, object] = {"platform": "linux", "libc": GLIBC, "thp": THP, "ignores_environment": False}
    given.update(facts)
    return heap.plan(environ or {"PATH": "/usr/bin"}, **given)  # type: ignore[arg-type]


def test_a_leader_on_a_recent_glibc_with_huge_pages_restarts_with_both_variables_and_its_own_environment() -> None:
    env = planned({"PATH": "/usr/bin", "LANG": "C.UTF-8"})
    assert isinstance(env, dict)
    assert env["PYTHONMALLOC"] == "malloc" and "glibc.malloc.hugetlb=1" in env["GLIBC_TUNABLES"].split(":")
    assert env["PATH"] == "/usr/bin" and env["LANG"] == "C.UTF-8"
    assert heap.chosen(env)


@pytest.mark.parametrize(
    ("environ", "facts", "said"),
    [
        ({"OPOD_HUGE_PAGES": "0"}, {}, "OPOD_HUGE_PAGES=0"),
        ({"OPOD_HUGE_PAGES": "off"}, {}, "OPOD_HUGE_PAGES=off"),
        ({}, {"platform": "darwin"}, "this is darwin"),
        ({}, {"ignores_environment": True}, "python -E"),
        ({"PYTHONMALLOC": "pymalloc_debug"}, {}, "PYTHONMALLOC is set already"),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, {}, "GLIBC_TUNABLES is set already"),
        ({}, {"libc": "glibc 2.31"}, "glibc 2.31 is older than 2.35"),
        ({}, {"libc": ""}, "not glibc"),
        ({}, {"thp": "always madvise [never]"}, "transparent huge pages are never"),
        ({}, {"thp": ""}, "not available"),
    ],
)
def test_where_it_cannot_help_or_the_operator_chose_the_leader_keeps_its_heap_and_says_why(
    environ: dict[str, str], facts: dict[str, object], said: str
) -> None:
    kept = planned({"PATH": "/usr/bin", **environ}, **facts)
    assert isinstance(kept, heap.Heap) and not kept.huge_pages
    assert said in kept.said and kept.said.startswith("heap: Python's own allocator")


@pytest.mark.parametrize(
    ("args", "leader"),
    [
        (["up"], True),
        (["up", "--no-worker", "--listen", "127.0.0.1:8080"], True),
        (["up", "--role", "leader"], True),
        (["up", "--role", "door"], False),
        (["up", "--role=door"], False),
        (["up", "--help"], False),
        (["join", "http://leader:8080", "--token", "t"], False),
        (["token", "ls"], False),
        ([], False),
    ],
)
def test_only_opod_up_as_a_leader_restarts(args: list[str], leader: bool) -> None:
    assert heap.runs_leader(args) is leader


def test_glibc_and_the_kernel_setting_are_read_as_they_are_written() -> None:
    assert heap.glibc_version("glibc 2.36") == (2, 36)
    assert heap.glibc_version("glibc 2.35.9000") == (2, 35)
    assert heap.glibc_version("musl libc") is None
    assert heap.thp_mode("[always] madvise never\n") == "always"
    assert heap.thp_mode("") == ""


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_opod_up_runs_on_huge_pages_in_the_same_process_and_its_engines_get_the_operators_environment(
    tmp_path: Path,
) -> None:
    machine = heap.plan_here({})
    if isinstance(machine, heap.Heap):
        pytest.skip(f"this machine cannot give the leader huge pages: {machine.why_not}")
    started = Leader(tmp_path / "home", extra=["--engine", "sim"], env={"OPOD_HUGE_PAGES": "1"})
    try:
        started.process.wait_for_line("smollm2-135m-instruct: serving on", timeout=60)
        pid = started.process.proc.pid  # the pid the command was started as: the restart keeps it
        assert heap.ON_HUGE_PAGES.said in started.process.output
        started_with = _environ(pid)  # as the restart set it (glibc keeps the tunables it read in its own copy)
        assert started_with["PYTHONMALLOC"] == "malloc", started_with
        assert started_with["GLIBC_TUNABLES"].startswith("glibc.malloc.hugetlb=1"), started_with
        assert _huge_kib(pid) > 0, "the leader's heap holds no transparent huge page"
        engines = started.process.children()
        assert engines, "the local worker started no engine"
        for child in engines:
            inherited = _environ(child)
            assert "PYTHONMALLOC" not in inherited and "GLIBC_TUNABLES" not in inherited, (child, inherited)
    finally:
        started.process.stop()


def test_opod_up_with_huge_pages_turned_off_keeps_pythons_allocator(tmp_path: Path) -> None:
    started = Leader(tmp_path / "home", worker=False, env={"OPOD_HUGE_PAGES": "0"})
    try:
        assert "heap: Python's own allocator (OPOD_HUGE_PAGES=0)" in started.process.output
        assert "PYTHONMALLOC" not in _environ(started.process.proc.pid)
    finally:
        started.process.stop()


def test_a_restart_that_cannot_happen_leaves_the_leader_starting_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "plan_here", lambda environ: {"PYTHONMALLOC": "malloc"})
    monkeypatch.setattr(heap.config, "environment", lambda: {})
    monkeypatch.setattr(heap.sys, "executable", "/nonexistent/python3")
    monkeypatch.setattr(heap, "current", heap.Heap(False, "not chosen"))
    heap.prepare(["up"])
    assert not heap.current.huge_pages and "/nonexistent/python3 again failed" in heap.current.said
