"""Watching one mounted file and applying each new version whole, or not at all.

A manager writes its files atomically (a temp file renamed over the old one);
the watcher polls the path every half second, comparing device, inode, size
and modification time, so a change applies within a second. Each new version
is read, parsed with its contract type and validated by its :class:`Applier`;
a valid one replaces the held version in one assignment, a bad one leaves the
last good version in place. Either way the outcome becomes an event:

- ``<kind>.updated``  data ``{"path", "revision", "previous_revision", ...}``
- ``<kind>.rejected`` data ``{"path", "reason", "kept_revision"}``; a file that
  disappears is reported this way too, with ``"missing": true``.

The same condition is reported once, not on every poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from opod import config
from opod.fleet.followers import EventSink

log = logging.getLogger("opod.snapshots")

POLL_INTERVAL = 0.5
"""Seconds between checks: a change applies within two polls (the brief allows 2 s)."""

MAX_FILE_BYTES = 16 << 20
"""A snapshot file larger than this is refused rather than read into memory."""

T = TypeVar("T")


class SnapshotError(ValueError):
    """A file that parsed but does not make sense; the message names the field and the remedy."""


class Applier(Protocol[T]):
    """One kind of file: how to parse it and how to make it current."""

    kind: str
    """Event prefix: ``auth``, ``policy``, ``plan``, ``routes``."""

    def parse(self, data: bytes) -> T:
        """The file's content as its contract type, validated; raises ``WireError`` or :class:`SnapshotError`."""
        ...

    def apply(self, snapshot: T) -> dict[str, Any]:
        """Make ``snapshot`` current in one swap; returns the event data (at least ``revision``)."""
        ...

    @property
    def revision(self) -> str | None:
        """The revision held now, or None when nothing was applied yet."""
        ...


def no_events(type_: str, subject: str, data: Mapping[str, object] | None = None, /) -> None:
    """An ``emit`` that only logs, for callers with no event stream."""
    log.info("%s %s %s", type_, subject, data)


@dataclass(frozen=True, slots=True)
class _Seen:
    signature: tuple[int, int, int, int] | None
    digest: str | None
    """The last content judged (applied or rejected)."""
    condition: str
    """What was last reported: ``""`` (nothing yet), ``judged:<digest>``, ``missing``, ``error:<text>``."""
    verdict: str | None = None
    """Why the content under ``digest`` was rejected; None when it was applied."""


class FileWatcher(Generic[T]):
    """Polls ``path`` and hands each new version to ``applier``; outcomes go to ``emit``."""

    def __init__(
        self, path: Path, applier: Applier[T], emit: EventSink = no_events, *, interval: float = POLL_INTERVAL
    ) -> None:
        self.path = Path(path)
        self.applier = applier
        self.emit = emit
        self.interval = interval
        self._seen = _Seen(None, None, "")
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        """Why the newest version on disk is not the one held (None when they agree)."""

    # --- one check ---------------------------------------------------------------

    def poll(self) -> str | None:
        """Check the file once; returns ``updated``, ``rejected``, ``missing`` or None when nothing changed."""
        return self._consider(self._observe())

    def _observe(self) -> tuple[str, Any]:
        """Read the file if it changed: ``("same", None)``, ``("missing", None)``, ``("error", text)`` or ``("data", (sig, bytes))``."""
        try:
            before = _signature(os.stat(self.path))
        except FileNotFoundError:
            return ("missing", None)
        except OSError as err:
            return ("error", f"cannot stat {self.path}: {err.strerror or err}")
        if before == self._seen.signature:
            return ("same", None)
        if before[2] > MAX_FILE_BYTES:
            return (
                "error",
                f"{self.path} is {before[2]} bytes, more than the {MAX_FILE_BYTES >> 20} MiB a snapshot may be",
            )
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
            after = _signature(os.stat(self.path))
        except FileNotFoundError:
            return ("missing", None)
        except OSError as err:
            return ("error", f"cannot read {self.path}: {err.strerror or err}")
        if after != before:
            # Written in place while we read: look again next poll rather than judge half a file.
            return ("same", None)
        return ("data", (before, data))

    def _consider(self, observation: tuple[str, Any]) -> str | None:
        what, detail = observation
        if what == "same":
            return None
        if what == "missing":
            return self._missing()
        if what == "error":
            return self._report_error(detail)
        signature, data = detail
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._seen.digest:
            # Touched, or back with the content already judged: nothing new to say.
            self._seen = _Seen(signature, digest, f"judged:{digest}", self._seen.verdict)
            self.last_error = self._seen.verdict
            return None
        try:
            snapshot = self.applier.parse(data)
            previous = self.applier.revision
            data_out = self.applier.apply(snapshot)
        except ValueError as err:  # WireError and SnapshotError are ValueErrors
            self._seen = _Seen(signature, digest, f"judged:{digest}", str(err))
            return self._reject(str(err))
        self._seen = _Seen(signature, digest, f"judged:{digest}", None)
        self.last_error = None
        event = {"path": str(self.path), **data_out, "previous_revision": previous}
        if previous is not None and data_out.get("revision") == previous:
            event["note"] = "the content changed but the revision did not; change the revision with the content"
        log.info("%s file %s applied: revision %r", self.applier.kind, self.path, data_out.get("revision"))
        self._send(f"{self.applier.kind}.updated", event)
        return "updated"

    def _missing(self) -> str | None:
        if self._seen.condition in ("", "missing"):
            # Never seen, or already said: a file that does not exist yet is not news.
            return None
        self._seen = _Seen(None, self._seen.digest, "missing", self._seen.verdict)
        kept = self.applier.revision
        reason = f"{self.path} disappeared; " + (
            f"keeping revision {kept!r} until it is back" if kept is not None else "nothing from it was ever applied"
        )
        return self._reject(reason, missing=True)

    def _report_error(self, text: str) -> str | None:
        condition = f"error:{text}"
        if self._seen.condition == condition:
            return None
        self._seen = _Seen(None, self._seen.digest, condition, self._seen.verdict)
        return self._reject(text)

    def _reject(self, reason: str, missing: bool = False) -> str:
        kept = self.applier.revision
        self.last_error = reason
        data: dict[str, Any] = {"path": str(self.path), "reason": reason, "kept_revision": kept}
        if missing:
            data["missing"] = True
        log.warning("%s file %s not applied: %s (keeping revision %r)", self.applier.kind, self.path, reason, kept)
        self._send(f"{self.applier.kind}.rejected", data)
        return "missing" if missing else "rejected"

    def _send(self, type_: str, data: dict[str, Any]) -> None:
        try:
            self.emit(type_, str(self.path), data)
        except Exception:  # a broken event sink must not stop the file from being applied
            log.exception("emitting %s failed", type_)

    # --- running -------------------------------------------------------------------

    async def start(self) -> None:
        """Apply what is there now, then keep polling in the background until :meth:`stop`."""
        if self._task is not None:
            return
        self._consider(await asyncio.to_thread(self._observe))
        self._task = asyncio.create_task(self._run(), name=f"watch {self.applier.kind} {self.path}")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                # Disk I/O off the loop; parsing and the swap on it, so readers never race a swap.
                self._consider(await asyncio.to_thread(self._observe))
            except Exception:  # keep watching whatever one version did
                log.exception("watching %s", self.path)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


# --- which path to watch ------------------------------------------------------------

DEFAULT_AUTH_FILE = Path("/etc/opod-auth/auth.json")
DEFAULT_POLICY_FILE = Path("/etc/opod-auth/policy.json")
DEFAULT_PLAN_FILE = Path("/etc/opod/plan.json")


def resolve(
    variable: str, default: Path, *, only_if_present: bool = False, environ: dict[str, str] | None = None
) -> Path | None:
    """The path to watch for a contract variable: its value, None for ``off``, else ``default``.

    ``only_if_present``: the default path is watched only when it exists now (the
    plan file: a leader without one is standalone). An explicit path is always watched.
    """
    value = config.read(variable, environ)
    if value is None:
        if only_if_present and not default.exists():
            return None
        return default
    if value.lower() == "off":
        return None
    return Path(value).expanduser()
