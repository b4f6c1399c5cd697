"""The leader's usage and lifecycle ledger: recorded on the request path, never lost, offered as cursors.

``begin`` and ``end`` write one journal line each (microseconds, no database), so an answer whose
``end`` returned survives a SIGKILL of the leader; the writer (:meth:`Ledger.run`) commits the
rows in batches, and the streams read the store only, so a row is offered once it is durable.
See ``journal.py`` for the files and ``records.py`` for the records and the recovery rules.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from opod.contract.adminapi import EventsBatch, UsageBatch
from opod.ledger import records as rec
from opod.ledger.bodies import BodyKeeper
from opod.ledger.journal import FORMAT, VERSION, Journal, JournalError, encode
from opod.ledger.records import UsageTicket, now_us
from opod.ledger.retention import Pruned, prune, retention_days
from opod.ledger.streams import events_batch, parse_after, parse_limit, usage_batch
from opod.ledger.waiting import wait_any
from opod.ledger.writer import BATCH_MAX, Writer, commit_records
from opod.store import Store
from opod.store.events import INT64_MAX

log = logging.getLogger("opod.ledger")

ROTATE_BYTES = 4 * 1024 * 1024  # a new journal segment past this; the old one goes once committed
PRUNE_EVERY_S = 600.0
IDLE_WAKE_S = 1.0
COMMIT_EVERY_S = 0.2
"""Under a light load, a commit waits until this long after the previous one began, so rows gather into one
transaction: a commit per request would cost the event loop more than the request itself (thread
hand-offs, SQLite's locks and page I/O, and the writer's thread holding the GIL the loop waits for).
The journal already keeps each row safe from a crash; this only delays when a row is offered on the
streams. Measured side by side (``python -m bench stages-ab``): a commit every 0.05 s, with the bodies'
writer in its own thread hops beside it, cost the all-on leader about a tenth more CPU per request."""
COMMIT_UNDER_LOAD_S = 1.0
"""Under a steady load (rows ending at :data:`LOAD_ROWS_PER_S` or more), a commit waits this long after the
previous one began instead: every commit writes each table's and index's last pages again, so fewer, larger
batches cost less per row (measured side by side with ``python -m bench stages-ab`` at 213 req/s: the all-on
leader spent 2.4 % less CPU per request, 20 pairs of 24 lower). Rows then reach the streams about a second
after their request, which only a steady load sees; a request alone is committed at once, as before."""
LOAD_ROWS_PER_S = 100.0
BACKOFF_S = (0.1, 5.0)  # first and longest wait after a failed commit


def gather_s(rows: int, seconds: float) -> float:
    """How long the next commit gathers rows after its previous one began, when that one committed ``rows`` that
    ended in the ``seconds`` before it began."""
    return COMMIT_UNDER_LOAD_S if rows >= LOAD_ROWS_PER_S * seconds else COMMIT_EVERY_S


class Ledger:
    """Usage rows and lifecycle events for the cursor streams.

    Ids are assigned by the store when a row commits and never restart: not across leader
    restarts, not after retention deletes rows (stronger than the contract, which lets ids restart
    with ``boot``). ``boot`` still changes with every leader start, as the contract asks.
    """

    def __init__(self, store: Store, journal: Journal, boot: int, keep: timedelta, rotate_bytes: int) -> None:
        """Use :meth:`open`."""
        self.store = store
        self.journal = journal
        self.boot = boot
        self.keep = keep
        self.rotate_bytes = rotate_bytes
        self.writer = Writer(store, journal.directory / "rejected.jsonl")
        self.bodies = BodyKeeper(store, offered=self._wake_writer)
        """Request bodies kept per the retention settings, written beside the usage rows, in the same thread hop."""
        self._lock = threading.Lock()  # one journal line and its in-memory effect at a time
        self._open: dict[str, bytes] = {}  # entry → start line, for requests in flight
        self._progress: dict[str, bytes] = {}  # entry → its last progress line, for streams in flight
        self._retired: list[tuple[int, list[Path]]] = []  # (last record in them, old segments)
        self._prefix = secrets.token_hex(8) + "-"  # entries are unique across processes and leaders
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake: asyncio.Event | None = None
        self._woken = False
        """The writer was woken since it last cleared ``_wake``: waking it again (each end of a busy round) would change nothing."""
        self._closed = False

    # --- start-up ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        store: Store,
        home: Path,
        *,
        boot: int | None = None,
        keep: timedelta | None = None,
        rotate_bytes: int = ROTATE_BYTES,
    ) -> Ledger:
        """Open the ledger in ``<home>/ledger`` and replay its journal into the store.

        Every end and event the journal holds is stored (once, however often it is replayed) and
        every start without an end becomes an ``interrupted`` row. ``boot`` is this leader start's
        number (nonzero); by default the store's next boot number. ``keep`` defaults to
        ``OPOD_USAGE_RETENTION_DAYS``. Raises JournalError, StoreError or ValueError, saying why.
        """
        keep = retention_days() if keep is None else keep
        if not isinstance(keep, timedelta) or keep <= timedelta(0):
            raise ValueError(f"keep must be a positive timedelta, not {keep!r}")
        journal = Journal.open(Path(home) / "ledger")
        try:
            number = store.next_boot() if boot is None else boot
            if isinstance(number, bool) or not isinstance(number, int) or not 0 < number <= INT64_MAX:
                raise ValueError(f"boot must be a whole number from 1 to {INT64_MAX}, not {number!r}")
            ledger = cls(store, journal, number, keep, rotate_bytes)
            ledger._replay()
        except BaseException:
            journal.close()
            raise
        return ledger

    def _replay(self) -> None:
        found = rec.recover(self.journal.read())
        new = 0
        for start in range(0, len(found.records), BATCH_MAX):
            new += commit_records(self.store, found.records[start : start + BATCH_MAX], self.writer.rejected)
        # Only now, with everything committed, may the old segments go.
        try:
            older = self.journal.rotate(self._header(), [])
        except OSError as err:
            raise JournalError(
                f"cannot start a journal segment in {self.journal.directory}: {err}; free disk space or fix the directory"
            ) from None
        for path in older:
            path.unlink(missing_ok=True)
        if new or found.interrupted or self.journal.bad_lines:
            log.warning(
                "ledger: the journal held %d records the store lacked (usage rows and events; %d requests were in flight "
                "when the last leader stopped, recorded as interrupted); %d lines were unreadable",
                new,
                found.interrupted,
                self.journal.bad_lines,
            )

    def _header(self) -> dict[str, Any]:
        return {"journal": FORMAT, "version": VERSION, "boot": self.boot, "ts_us": rec.now_us()}

    # --- the request path: synchronous, microseconds, never raises ---------------

    def begin(
        self,
        *,
        request_id: str,
        api_key_id: str,
        user_id: str,
        model: str,
        protocol: str,
        project_id: str = "",
        team_id: str = "",
        org_id: str = "",
        end_user: str = "",
        tags: Mapping[str, str] | None = None,
        details: Mapping[str, object] | None = None,
    ) -> UsageTicket:
        """A request starts: journal it, so a crash before its end leaves an ``interrupted`` row
        (attributed to the same project, team and org, with its end user, tags and ``details``: request
        record fields known already, as :meth:`end` takes them).

        ``end_user``, ``tags`` and a guardrail's reason in ``details`` are the client's and a webhook's,
        cleaned here; the other values are the gateway's own (a request id sanitized at the edge, ids from
        the key table, a model resolved against the registry) and are journaled as given: ``records.to_row``
        cleans every field before the store."""
        entry = f"{self._prefix}{next(self._ids):x}"
        try:
            ticket = UsageTicket(
                entry, request_id, api_key_id, user_id, model, protocol, now_us(), project_id, team_id, org_id
            )
            if end_user:
                ticket.end_user = rec.text(end_user, "end_user")
            if tags is not None:
                ticket.tags_json = rec.json_text(tags, "tags")
            if details:
                ticket.details = rec.request_details(details)
            start = rec.start_record(ticket)
            try:  # here, not in a helper: a call more for each of a request's two lines
                line = encode(start)
            except (TypeError, ValueError):
                start, line = _journalable_line(start)
            ticket.start = start
            with self._lock:
                if self._closed:
                    log.error("ledger: begin after close; request %r is not recorded", request_id)
                    return ticket
                self.journal.append(line)
                self._open[entry] = line
            return ticket
        except Exception:
            log.exception("ledger: cannot record the start of request %r", request_id)
            return UsageTicket(entry, "", "", "", "", "", rec.now_us())

    def end(
        self,
        ticket: UsageTicket,
        *,
        outcome: str,
        prompt_tokens: int,
        completion_tokens: int,
        latency_ms: int,
        ttft_ms: int = 0,
        node_id: str = "",
        route: Mapping[str, object] | None = None,
        cost_micros: int = 0,
        details: Mapping[str, object] | None = None,
    ) -> None:
        """A request ends (ok, error, cancelled: completion tokens actually sent). Call it before the
        answer's last byte goes out: once it returns, the row survives a crash of this process.
        ``details``: the request record's ``status``, ``served_model``, ``queue_ms``, ``cache_hit``, ``body_state``
        and guard fields (``opod.ledger.records.request_details``)."""
        try:
            if not isinstance(ticket, UsageTicket):
                log.error(
                    "ledger: end() needs the ticket begin() returned, not %s; no row recorded", type(ticket).__name__
                )
                return
            record = rec.finished_record(
                ticket,
                now_us(),
                outcome,
                prompt_tokens,
                completion_tokens,
                latency_ms,
                ttft_ms,
                node_id,
                route,
                cost_micros,
                details,
            )
            try:
                line = encode(record)
            except (TypeError, ValueError):
                record, line = _journalable_line(record)
            entry = ticket.entry
            with self._lock:
                if ticket.ended:
                    log.warning("ledger: request %r ended twice; the second end is ignored", ticket.request_id)
                    return
                if self._closed:
                    log.error("ledger: end after close; the usage of request %r is lost", ticket.request_id)
                    return
                ticket.ended = True
                self.journal.append(line)
                self._open.pop(entry, None)
                if self._progress:  # only streams report progress
                    self._progress.pop(entry, None)
                self.writer.add(record)
            self._wake_writer()
        except Exception:
            log.exception("ledger: cannot record the end of request %r", getattr(ticket, "request_id", "?"))

    def progress(self, ticket: UsageTicket, *, prompt_tokens: int, completion_tokens: int, node_id: str = "") -> None:
        """How far a stream in flight has come: journaled (not committed), so that a crash before its end
        leaves an ``interrupted`` row with these counts instead of none."""
        try:
            line = encode(rec.progress_record(ticket, rec.now_us(), prompt_tokens, completion_tokens, node_id))
            with self._lock:
                if ticket.ended or self._closed:
                    return
                self.journal.append(line)
                self._progress[ticket.entry] = line
        except Exception:
            log.exception("ledger: cannot record the progress of request %r", getattr(ticket, "request_id", "?"))

    def event(self, type: str, subject: str, data: Mapping[str, object] | None = None) -> None:
        """A lifecycle event (``node.registered``, …): journaled, then committed like usage rows."""
        try:
            record = rec.event_record(
                self._prefix + format(next(self._ids), "x"),
                rec.now_us(),
                rec.label(type, "event type", "unknown"),
                rec.text(subject, "event subject"),
                "{}" if data is None else rec.json_text(data, "event data"),
            )
            line = encode(record)
            with self._lock:
                if self._closed:
                    log.error("ledger: event after close; %s %s is lost", type, subject)
                    return
                self.journal.append(line)
                self.writer.add(record)
            self._wake_writer()
        except Exception:
            log.exception("ledger: cannot record event %r for %r", type, subject)

    def _wake_writer(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or self._woken:
            return
        self._woken = True
        if threading.get_ident() == self._loop_thread:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    @property
    def in_flight(self) -> int:
        """Requests begun and not ended."""
        return len(self._open)

    # --- the streams --------------------------------------------------------------

    async def usage_page(self, after: int | str | None, limit: int | str | None) -> UsageBatch:
        """A page of ``/admin/v1/usage/stream``; CursorError (a ValueError) for a bad after or limit."""
        after, limit = parse_after(after), parse_limit(limit)
        found = await asyncio.to_thread(self.store.usage_after, after, limit + 1)
        return usage_batch(found, after, limit, self.boot)

    async def events_page(self, after: int | str | None, limit: int | str | None) -> EventsBatch:
        """A page of ``/admin/v1/events/stream``; CursorError (a ValueError) for a bad after or limit."""
        after, limit = parse_after(after), parse_limit(limit)
        found = await asyncio.to_thread(self.store.events_after, after, limit + 1)
        return events_batch(found, after, limit, self.boot)

    # --- the writer -----------------------------------------------------------------

    async def flush(self) -> None:
        """Wait until everything recorded so far is in the store; StoreError when it cannot be.

        The request bodies waiting are written in the thread of the first usage commit (in one of their
        own when there is none, or it failed)."""
        bodies = self.bodies.take()
        write = partial(self.bodies.write, bodies) if bodies else None
        ran = False
        try:
            ran = await self.writer.drain(along=write)
        finally:
            if write is not None and not ran:
                await self.writer.in_thread(write)
        await self._trim_aside()

    async def prune(self, now: datetime | None = None) -> Pruned:
        """Delete usage rows and events older than the retention (the writer does this by itself)."""
        return await prune(self.store, self.keep, now)

    async def run(self, stop: asyncio.Event) -> None:
        """The writer: group commit, journal rotation and retention, until ``stop`` is set.

        A failed commit is logged and retried with back-off; nothing is dropped meanwhile. When
        stopped, it commits what is left (what it cannot commit stays in the journal for the next
        start) and trims the journal.
        """
        loop = asyncio.get_running_loop()
        self._loop, self._loop_thread, self._wake = loop, threading.get_ident(), asyncio.Event()
        self._woken = False
        helpers = [asyncio.create_task(self._relay(stop)), asyncio.create_task(self._retention(stop))]
        backoff = BACKOFF_S[0]
        last_began = loop.time() - COMMIT_EVERY_S
        try:
            while not stop.is_set():
                self._wake.clear()  # before draining: an end() meanwhile sets it again
                self._woken = False  # after clearing: an end() that saw it still set was added before the drain
                began, committed = loop.time(), self.writer.committed
                try:
                    await self.flush()
                    backoff = BACKOFF_S[0]
                except Exception as err:
                    log.error(
                        "ledger: cannot commit %d records (%s); they stay in the journal, retrying in %.1f s",
                        self.writer.backlog,
                        err,
                        backoff,
                    )
                    await self._idle(backoff, stop)
                    backoff = min(backoff * 2, BACKOFF_S[1])
                    continue
                if self.journal.size >= self.rotate_bytes or self.journal.broken:
                    self._rotate()
                    await self._trim_aside()
                if not self.writer.backlog and not self.bodies.waiting:
                    await self._idle(IDLE_WAKE_S, stop)
                gather = began + gather_s(self.writer.committed - committed, began - last_began) - loop.time()
                last_began = began
                if gather > 0 and not stop.is_set():
                    await _wait(stop, gather)
        finally:
            for task in helpers:
                task.cancel()
            self._loop = self._wake = None
            await self._final_flush()

    async def _relay(self, stop: asyncio.Event) -> None:
        await stop.wait()
        if self._wake is not None:
            self._wake.set()

    async def _retention(self, stop: asyncio.Event) -> None:
        # Its own task: deleting a backlog of old rows (after a long downtime) must not hold up commits.
        while not stop.is_set():
            await self._prune_logged()
            await _wait(stop, PRUNE_EVERY_S)

    async def _idle(self, seconds: float, stop: asyncio.Event) -> None:
        """Wait ``seconds``, or less when a row comes or the writer is told to stop."""
        assert self._wake is not None
        await wait_any(seconds, self._wake, stop)

    async def _prune_logged(self) -> None:
        try:
            gone = await self.prune()
        except Exception as err:
            log.error("ledger: retention could not delete old rows (%s); trying again in %.0f s", err, PRUNE_EVERY_S)
            return
        if gone.usage or gone.events:
            log.info(
                "ledger: retention deleted %d usage rows and %d events older than %s",
                gone.usage,
                gone.events,
                self.keep,
            )
        if gone.bodies:
            log.info("ledger: retention deleted %d expired request bodies", gone.bodies)

    async def _final_flush(self) -> None:
        try:
            await self.flush()
        except Exception as err:
            log.error(
                "ledger: %d records could not be committed at stop (%s); the next start replays them from the journal",
                self.writer.backlog,
                err,
            )
            return
        self._rotate()
        self._trim()

    def _rotate(self) -> None:
        """Start a new journal segment carrying the starts in flight; the old ones go once committed."""
        with self._lock:
            if self._closed:
                return
            try:
                older = self.journal.rotate(self._header(), [*self._open.values(), *self._progress.values()])
            except OSError as err:
                log.error("ledger: cannot start a new journal segment in %s: %s", self.journal.directory, err)
                return
            self._retired.append((self.writer.recorded, older))

    def _trim(self) -> None:
        """Delete the retired segments that are committed."""
        _delete(self._due_segments())

    async def _trim_aside(self) -> None:
        """:meth:`_trim` in a thread, when there is anything to do: unlinking a grown segment can
        take a millisecond or more, which every request in flight would wait for on the loop."""
        due = self._due_segments()
        if due:
            await asyncio.to_thread(_delete, due)

    def _due_segments(self) -> list[Path]:
        """Retired segments whose every end and event is committed, taken off the list."""
        due: list[Path] = []
        with self._lock:
            while self._retired and self._retired[0][0] <= self.writer.committed:
                due += self._retired.pop(0)[1]
        return due

    def close(self) -> None:
        """Close the journal. Records not yet committed stay in it and are replayed at the next open;
        call ``await flush()`` (or stop :meth:`run`) first to commit them now."""
        if self._closed:
            return
        if not self.writer.backlog:
            self._rotate()  # everything is committed: leave only the starts in flight behind
            self._trim()
        with self._lock:
            self._closed = True
            if self.writer.backlog or self._open:
                log.info(
                    "ledger: closed with %d records to commit and %d requests in flight; the next start replays them",
                    self.writer.backlog,
                    len(self._open),
                )
            self.journal.close()
        self.writer.close()


def _delete(segments: list[Path]) -> None:
    for path in segments:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            log.warning("ledger: cannot delete the committed journal segment %s: %s", path, err.strerror)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Until ``event`` is set or ``seconds`` have passed, whichever comes first."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass


def _journalable_line(record: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``record`` that ``encode`` refused, with each value JSON cannot hold (a caller's bug) converted and logged,
    and its journal line: the record is journaled, not lost."""
    record = rec.journalable(record)
    return record, encode(record)
