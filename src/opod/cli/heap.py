"""The leader's heap: glibc's allocator on transparent huge pages, chosen before the leader imports anything.

Under load a request runs mostly cold (``docs/dataplane.md``): the objects and code it touches have left the
CPU's caches and its address translations the TLB since the last one. Python's own allocator (pymalloc) hands
out objects from arenas of its own on 4 KiB pages, which the kernel cannot back with huge pages; glibc's
``malloc``, told by its ``hugetlb`` tunable to ask for transparent huge pages, keeps the heap on 2 MiB pages, so
far fewer translations miss. ``python -m bench stages-ab --base-python`` measured the leader this way against
Python's own allocator; ``bench/results/stages-ab-huge-pages.md`` has the pairs.

Both choices are read once, as a process starts (``PYTHONMALLOC`` by the interpreter, ``GLIBC_TUNABLES`` by glibc),
so ``opod up`` restarts itself once, at its first line, with both set, the same command line and the same process
id; the restarted leader puts the environment back as the operator gave it, so the engines it starts inherit
theirs, not the leader's allocator. Nothing happens where it cannot help or the operator chose: off Linux, on a
glibc older than 2.35 (no ``hugetlb`` tunable) or another C library, with transparent huge pages ``never``, when
``PYTHONMALLOC`` or ``GLIBC_TUNABLES`` is set already, with ``python -E``, or with ``OPOD_HUGE_PAGES=0``; and
where the interpreter cannot be started again, the leader goes on as it is. The log says which (:attr:`Heap.said`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opod import config

TUNABLES = "glibc.malloc.hugetlb=1:glibc.malloc.trim_threshold=134217728:glibc.malloc.mmap_threshold=33554432"
"""Huge pages for the heap (madvise), and a heap that keeps them: allocations up to 32 MiB come from the heap
rather than mappings of their own (too small for a huge page each), and its top is given back to the system only
past 128 MiB free (a trim splits the huge pages it cuts through)."""
ALLOCATOR = "malloc"
VARIABLES = ("PYTHONMALLOC", "GLIBC_TUNABLES")
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)
OFF = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Heap:
    """How this process allocates: ``huge_pages``, and where not, why (said in the leader's log)."""

    huge_pages: bool
    why_not: str = ""

    @property
    def said(self) -> str:
        if self.huge_pages:
            return "heap: glibc's malloc on transparent huge pages (OPOD_HUGE_PAGES=0 for Python's own allocator)"
        return f"heap: Python's own allocator ({self.why_not})"


ON_HUGE_PAGES = Heap(True)

current = Heap(False, "not chosen: the process did not start as opod up")
"""This process's heap, as :func:`prepare` found or made it."""


def runs_leader(args: Sequence[str]) -> bool:
    """Whether the command line (after the program's name) starts a leader: ``opod up``, not its door role."""
    if not args or args[0] != "up":
        return False
    rest = list(args[1:])
    if "--help" in rest or "--role=door" in rest:
        return False
    return not any(arg == "--role" and rest[i + 1 : i + 2] == ["door"] for i, arg in enumerate(rest))


def glibc_version(said: str) -> tuple[int, int] | None:
    """``(major, minor)`` of ``os.confstr("CS_GNU_LIBC_VERSION")``'s text (``glibc 2.36``); ``None`` for another."""
    found = re.fullmatch(r"glibc (\d+)\.(\d+)\S*", said.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def thp_mode(setting: str) -> str:
    """The selected mode of the kernel's transparent huge pages (``always [madvise] never`` → ``madvise``)."""
    found = re.search(r"\[(\w+)\]", setting)
    return found.group(1) if found else ""


def chosen(environ: Mapping[str, str]) -> bool:
    """Whether this process was started with the leader's heap (both variables as :func:`plan` sets them)."""
    return environ.get("PYTHONMALLOC") == ALLOCATOR and environ.get("GLIBC_TUNABLES") == TUNABLES


def plan(
    environ: Mapping[str, str], *, platform: str, libc: str, thp: str, ignores_environment: bool
) -> dict[str, str] | Heap:
    """The environment to restart in for the heap on huge pages, or the :class:`Heap` this process keeps.

    ``libc`` is ``os.confstr("CS_GNU_LIBC_VERSION")``'s text, ``thp`` the kernel's setting's (empty where there is
    none).
    """
    setting = config.read("OPOD_HUGE_PAGES", environ)
    if setting is not None and setting.lower() in OFF:
        return Heap(False, f"OPOD_HUGE_PAGES={setting}")
    if not platform.startswith("linux"):
        return Heap(False, f"transparent huge pages are Linux's; this is {platform}")
    if ignores_environment:
        return Heap(False, "python -E ignores PYTHONMALLOC")
    for name in VARIABLES:
        if name in environ:
            return Heap(False, f"{name} is set already, and the operator's choice stands")
    version = glibc_version(libc)
    if version is None:
        return Heap(False, f"the C library is {libc or 'not glibc'}, without glibc's hugetlb tunable")
    if version < MIN_GLIBC:
        return Heap(False, f"glibc {version[0]}.{version[1]} is older than 2.35, which has the hugetlb tunable")
    mode = thp_mode(thp)
    if mode not in ("always", "madvise"):
        return Heap(False, f"the kernel's transparent huge pages are {mode or 'not available'}")
    return {**environ, "PYTHONMALLOC": ALLOCATOR, "GLIBC_TUNABLES": TUNABLES}


def plan_here(environ: Mapping[str, str]) -> dict[str, str] | Heap:
    """:func:`plan` with this machine's facts: its platform, C library, kernel setting and interpreter flags."""
    try:
        thp = THP_SETTING.read_text()
    except OSError:
        thp = ""
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else None
    return plan(
        environ,
        platform=sys.platform,
        libc=libc or "",
        thp=thp,
        ignores_environment=bool(sys.flags.ignore_environment),
    )


def prepare(args: Sequence[str]) -> None:
    """Run first by the ``opod`` command: for a leader, restart on the huge-page heap, or note why not; in the
    restarted leader, put the environment back as the operator gave it."""
    global current
    environ = config.environment()
    if chosen(environ):
        config.unset(VARIABLES)  # the engines and tools the leader starts get the operator's environment
        current = ON_HUGE_PAGES
        return
    if not runs_leader(args):
        return
    planned = plan_here(environ)
    if isinstance(planned, Heap):
        current = planned
        return
    if not sys.executable or not sys.orig_argv:
        current = Heap(False, "the interpreter's path or command line is unknown, so it cannot start again")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, planned)
    except OSError as err:  # the interpreter cannot be started again (gone, not executable): go on as it is
        current = Heap(False, f"starting {sys.executable} again failed: {err.strerror}")
