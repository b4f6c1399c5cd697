"""The leader's event loop kept on one core; the threads and processes it starts left free.

A request to the leader runs mostly cold (``docs/dataplane.md``): between two requests the loop sleeps,
and other processes' work empties the core's caches of the code and objects a request touches. A loop
thread the scheduler moves from core to core pays that again on each move, into caches that never held
its work; kept on one core it finds more of it where it left it. ``python -m bench stages-ab`` measured
the pinned leader against the free one (``bench/results/stages-ab-loop-pinned.md``).

Only the loop's thread is pinned. What it starts afterwards would inherit the pin, so each starter frees
what it starts: a thread by :func:`free_this_thread` as it begins (the ledger's writer, the store's change
thread, the loop's default executor, :func:`executor`), a process by :func:`free_child` between fork and
exec (the engines, their builds and opod's upgrades), a ZeroMQ context's threads by :func:`free_cpus` (the
KV event listeners); uvloop's own worker threads are started before the pin. Such threads and processes get
the CPUs the process had before it.

``OPOD_LOOP_CPU``: unset or ``auto`` pins the loop, where the process may run on more than one CPU, to
the one fewest other processes are pinned to (another leader's loop, say), the one it runs on among
those; ``off`` leaves it free; a number pins it to that CPU.

The pinned loop's thread is named :data:`LEADER_NAME`, so that a worker on the same machine finds the CPUs
leaders' loops hold (:func:`leader_loop_cpus`) and keeps itself (:func:`keep_worker_apart`) and the engines it starts
(:func:`engine_cpus`) off them: their work on a leader's CPU empties the caches the leader's next request would find
its code and objects in (``python -m bench loop-core`` measured what that costs, ``python -m bench compare`` what it
does to a request on a machine of two CPUs). ``OPOD_ENGINE_CPUS``: unset or ``apart`` keeps them, an engine that leaves
its computing to a GPU (or does none: the simulator), off those CPUs wherever a CPU is left; ``all`` leaves them on
every CPU. An engine that computes on the CPU (llama.cpp) is given every CPU the worker had, whatever the setting.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from opod import config

SETTING = "OPOD_LOOP_CPU"
ENGINE_SETTING = "OPOD_ENGINE_CPUS"
OFF = ("off", "no", "false")
LEADER_NAME = b"opod-leader"
"""The name a leader's pinned event-loop thread takes (its process's ``/proc/PID/comm``: the loop is its main thread)."""
PR_SET_NAME = 15
THREAD_STAT = Path("/proc/thread-self/stat")
PROC = Path("/proc")
ONE_CPU = re.compile(rb"^Cpus_allowed_list:\s*(\d+)\s*$", re.MULTILINE)

log = logging.getLogger("opod.cpu")

_free: frozenset[int] | None = None
"""The CPUs the process could run on before the loop's thread was pinned; ``None`` while it is not."""
_whole: frozenset[int] | None = None
"""The CPUs a worker could run on before it kept itself off leaders' loops (:func:`keep_worker_apart`); ``None`` until
it was asked."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the loop runs: ``cpu`` when pinned, else ``None`` and why not."""

    cpu: int | None
    why_not: str = ""
    mistaken: bool = False
    """The setting names no CPU this process may use: said as a warning."""

    @property
    def said(self) -> str:
        if self.cpu is not None:
            return f"event loop pinned to CPU {self.cpu} ({SETTING}=off lets it move)"
        return f"event loop free to move between CPUs ({self.why_not})"


def plan(
    setting: str | None, allowed: frozenset[int], running_on: int | None, taken: Mapping[int, int] | None = None
) -> Placement:
    """Where the loop goes, from the setting's text, the CPUs the thread may use, the one it is on now, and how
    many other processes each CPU holds pinned (:func:`taken_cpus`)."""
    if setting is not None and setting.lower() in OFF:
        return Placement(None, f"{SETTING}={setting}")
    if setting is not None and not chooses(setting):
        if not setting.isdigit():
            return Placement(None, f"{SETTING}={setting!r} is neither auto, off nor a CPU's number", True)
        if int(setting) not in allowed:
            cpus = ",".join(map(str, sorted(allowed)))
            return Placement(None, f"{SETTING}={setting}: this process may run on CPUs {cpus} only", True)
        return Placement(int(setting))
    if len(allowed) < 2:
        return Placement(None, "the process may run on one CPU only")
    taken = taken or {}
    fewest = min(taken.get(c, 0) for c in allowed)
    least_taken = sorted(c for c in allowed if taken.get(c, 0) == fewest)
    return Placement(running_on if running_on in least_taken else least_taken[0])


def chooses(setting: str | None) -> bool:
    """Whether the setting leaves the CPU to :func:`plan` (unset or ``auto``), which then reads :func:`taken_cpus`."""
    return setting is None or setting.lower() == "auto"


def running_on() -> int | None:
    """The CPU the calling thread runs on (``/proc/thread-self/stat``'s 39th field), ``None`` where unknown."""
    try:
        data = THREAD_STAT.read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # the fields after the command name, state first
    return int(fields[36]) if len(fields) > 36 else None


def _pinned_processes() -> Iterator[tuple[str, int, bytes]]:
    """Each process whose main thread may run on one CPU alone: its /proc entry, that CPU and its status text."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return
    for name in entries:
        if not name.isdigit():
            continue
        try:
            status = (PROC / name / "status").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found = ONE_CPU.search(status)
        if found:
            yield name, int(found.group(1)), status


def taken_cpus(own: int | None = None) -> Counter[int]:
    """CPU → how many user processes (other than ``own``) run pinned to it alone, by their main thread's affinity."""
    # A kernel thread (one per CPU, most of them) has no memory of its own.
    return Counter(cpu for name, cpu, status in _pinned_processes() if int(name) != own and b"\nVmSize:" in status)


async def pin_event_loop() -> Placement:
    """Pin the running loop's thread as ``OPOD_LOOP_CPU`` says (Linux only), and log where it went; uvloop's threads
    run free, and the default executor's when it is :func:`executor`'s."""
    if sys.platform.startswith("linux"):
        placement = await _pin(asyncio.get_running_loop())
    else:
        placement = Placement(None, f"pinning a thread is Linux's; this is {sys.platform}")
    log.log(logging.WARNING if placement.mistaken else logging.INFO, placement.said)
    return placement


async def _pin(loop: asyncio.AbstractEventLoop) -> Placement:
    global _free
    allowed = frozenset(os.sched_getaffinity(0))
    setting = config.read(SETTING)
    placement = plan(setting, allowed, running_on(), taken_cpus(os.getpid()) if chooses(setting) else None)
    if placement.cpu is None:
        return placement
    # uvloop's worker threads (name look-ups, files) start at their first use, inheriting what the loop's thread
    # has then: started now, by a look-up of a number that asks no resolver.
    await loop.getaddrinfo("127.0.0.1", None, flags=socket.AI_NUMERICHOST)
    try:
        os.sched_setaffinity(0, {placement.cpu})  # 0: the calling thread, not the whole process
    except OSError as err:
        return Placement(None, f"the kernel refused to pin it: {err.strerror}")
    _free = allowed
    _name_this_thread(LEADER_NAME)
    return placement


def _name_this_thread(name: bytes) -> None:
    """The calling thread's name as the kernel shows it (``prctl(PR_SET_NAME)``); nothing where that cannot be set."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)


def leader_loop_cpus() -> frozenset[int]:
    """The CPUs opod leaders' event loops on this machine are pinned to (each one's thread named :data:`LEADER_NAME`)."""
    found: set[int] = set()
    for name, cpu, _ in _pinned_processes():
        try:
            if (PROC / name / "comm").read_bytes().rstrip(b"\n") == LEADER_NAME:
                found.add(cpu)
        except OSError:  # gone meanwhile
            continue
    return frozenset(found)


def engine_plan(
    setting: str | None, computes_on_cpu: bool, allowed: frozenset[int], loops: frozenset[int]
) -> frozenset[int] | None:
    """The CPUs an engine gets, from ``OPOD_ENGINE_CPUS``'s text, whether it computes on the CPU, the CPUs the worker
    may use and those leaders' loops hold; ``None``: every CPU the worker may use."""
    if computes_on_cpu or (setting or "").lower() == "all":
        return None
    left = allowed - loops
    if not left or left == allowed:
        return None
    return left


def _engine_setting() -> str | None:
    setting = config.read(ENGINE_SETTING)
    if setting is not None and setting.lower() not in ("apart", "all"):
        log.warning("%s=%r is neither apart nor all; taken as apart", ENGINE_SETTING, setting)
    return setting


def keep_worker_apart() -> frozenset[int] | None:
    """Move every thread of this worker off the CPUs leaders' event loops on this machine are pinned to, where an engine
    that does not compute on the CPU would go off them (:func:`engine_plan`): the worker's own work (its heartbeats,
    the KV events its engines publish) takes a leader's caches as an engine's does. The CPUs it is now on, or ``None``
    where it stays on every CPU it had. A process that pinned a loop of its own (a leader) is never moved.

    Asked at each registration with a leader (one on this machine is pinned by then). What the worker starts afterwards
    inherits its CPUs; an engine that computes on the CPU is given back every one (:func:`engine_cpus`)."""
    global _whole
    if not sys.platform.startswith("linux") or _free is not None:
        return None
    whole = _whole or frozenset(os.sched_getaffinity(0))
    apart = engine_plan(_engine_setting(), False, whole, leader_loop_cpus())
    target = apart or whole
    if frozenset(os.sched_getaffinity(0)) != target:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), target)
            except OSError:  # a thread that ended meanwhile
                continue
        if apart:
            log.info(
                "worker on CPUs %s, off the leaders' event loops on CPUs %s (%s=all leaves it on every CPU)",
                cpu_list(target),
                cpu_list(whole - target),
                ENGINE_SETTING,
            )
        else:
            log.info("worker on every CPU it may use (%s)", cpu_list(target))
    _whole = whole
    return apart


def cpu_list(cpus: Iterable[int]) -> str:
    """CPUs as the kernel lists them, in order: ``0,2,3``."""
    return ",".join(map(str, sorted(cpus)))


def engine_cpus(computes_on_cpu: bool) -> frozenset[int] | None:
    """The CPUs for an engine this process starts (:func:`engine_plan` on this machine): off leaders' loop CPUs, or,
    for an engine that computes on the CPU, every CPU the worker had before it kept itself apart; ``None``: every CPU
    the process had before any pin (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    allowed = _whole or _free or frozenset(os.sched_getaffinity(0))
    if computes_on_cpu:
        return _whole
    return engine_plan(_engine_setting(), computes_on_cpu, allowed, leader_loop_cpus())


def executor() -> ThreadPoolExecutor:
    """The loop's default executor, set before its first use: its threads, made from the loop's thread as they are
    needed, free themselves once it is pinned (setting one only at the pin would end the threads of the one before)."""
    return ThreadPoolExecutor(thread_name_prefix="opod", initializer=free_this_thread)


def free_cpus() -> frozenset[int]:
    """The CPUs the process had before the loop was pinned; empty while it is not (nothing to free)."""
    return _free or frozenset()


def free_this_thread() -> None:
    """Give the calling thread the CPUs the process had before the loop was pinned (nothing when it is not), and its
    own name where the kernel shows it: a thread made after the loop's took the loop's name with its CPU."""
    if _free is None:
        return
    _name_this_thread(threading.current_thread().name.encode("ascii", "replace"))
    refused = _unpin()
    if refused:
        log.info("a thread stays on the event loop's CPU (%s)", refused)


def free_child() -> None:
    """Between fork and exec: the new process gets the CPUs the leader had, not its loop's one. Nothing is logged
    there (a forked child must not take the logging lock), and a refusal leaves the start to go on."""
    _unpin()


def _unpin() -> str | None:
    """The calling thread on the CPUs the process had; why not, when the kernel refused."""
    if _free is None:
        return None
    try:
        os.sched_setaffinity(0, _free)
    except OSError as err:
        return err.strerror or str(err)
    return None
