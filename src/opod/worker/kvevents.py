"""An engine's KV-cache events, turned into the contract's block hashes and held until the next heartbeat.

Two pieces, neither touching a socket or the wire (:mod:`opod.worker.kvlistener` does):

* :class:`EngineBlocks` keeps one engine's map from its own block hashes to
  contract hashes. An engine hash says nothing to the leader, so each stored
  block is hashed again from its ``token_ids`` with
  :func:`opod.contract.blockhash.block_hash`, chained from its parent's
  contract hash (found through ``parent_block_hash``).
* :class:`KVReport` is the worker's side of ``Heartbeat.kv_blocks``: what
  changed since the previous heartbeat, across all of the worker's engines,
  bounded, drained once per heartbeat into one :class:`~opod.contract.nodeapi.KVBlocks`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opod.contract.blockhash import block_hash
from opod.contract.nodeapi import KVBlocks

__all__ = [
    "MAX_PENDING",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EngineBlocks",
    "EngineHash",
    "Event",
    "KVReport",
]

log = logging.getLogger("opod.worker")

MAX_PENDING = 100_000
"""Changes held for one heartbeat at most. 100,000 hashes are ~2 MB of JSON, well inside the leader's 4 MiB body cap."""
MIN_KICK_INTERVAL = 1.0
"""Early heartbeats for cache changes come at most this often, so the leader's index is about a second behind."""
GATHER = 0.05
"""An early heartbeat waits this long first, so one burst of batches (a long prefill) goes out together."""

EngineHash = int | bytes
"""An engine's own block hash: a uint64 (vLLM's default) or a 32-byte digest."""

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: Sequence[int]
    block_size: int
    plain: tuple[bool, ...]
    """Per block: no LoRA, cache salt or multimodal key, so its tokens alone name it (as contract hashes do)."""
    tracked: bool = True
    """In the engine's own cache (GPU tier, first KV-cache group)."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    tracked: bool = True


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


# --- one engine -------------------------------------------------------------------------------


@dataclass(slots=True)
class Counters:
    """What one engine's events came to, for logs and tests: nothing here changes what is reported."""

    batches: int = 0
    stored: int = 0
    removed: int = 0
    unknown_removed: int = 0
    """Removals of engine hashes never seen stored (stored before a reset, or before the listener started)."""
    orphans: int = 0
    """Stored blocks whose parent is unknown: their contract hash cannot be computed."""
    not_plain: int = 0
    """Blocks keyed by more than tokens (LoRA, cache salt, images): a token-only hash would misname them."""
    untracked: int = 0
    """Events of an offload tier or another KV-cache group."""
    other_block_size: int = 0
    resets: int = 0
    last_reset: str = ""


class EngineBlocks:
    """One engine's cached blocks: its hashes → contract hashes (``None``: known, but not reportable)."""

    def __init__(self, report: KVReport, name: str = "engine") -> None:
        self.report = report
        self.name = name
        self.counters = Counters()
        self._blocks: dict[EngineHash, str | None] = {}
        self._refs: dict[str, int] = {}
        """Contract hash → engine hashes naming it; the report hears of the first and the last."""
        report.attach()
        self._attached = True

    def apply(self, events: Iterable[Event]) -> None:
        self.counters.batches += 1
        for event in events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                if not event.tracked:
                    self.counters.untracked += 1
                    continue
                for ehash in event.block_hashes:
                    self._remove(ehash)
            else:
                self.reset("the engine cleared its prefix cache")

    def reset(self, reason: str) -> None:
        """Forget everything this engine held; the next heartbeat says ``cleared`` and the index rebuilds."""
        self.counters.resets += 1
        self.counters.last_reset = reason
        log.info("KV events of %s: %s; the leader is told to rebuild", self.name, reason)
        self._blocks.clear()
        held, self._refs = list(self._refs), {}
        self.report.forget(held, clear=True)

    def release(self) -> None:
        """The engine is gone: its blocks leave the report (once)."""
        if not self._attached:
            return
        self._attached = False
        self._blocks.clear()
        held, self._refs = list(self._refs), {}
        self.report.forget(held, clear=False)
        self.report.detach()

    def _store(self, event: BlockStored) -> None:
        c = self.counters
        n = len(event.block_hashes)
        if not event.tracked:
            c.untracked += n
            return
        if not self.report.adopt_block_size(event.block_size):
            c.other_block_size += n
            return
        size = event.block_size
        parent: str | None = ""
        if event.parent is not None:
            parent = self._blocks.get(event.parent, _MISSING)
            if parent is _MISSING:
                c.orphans += n
                parent = None
        if len(event.token_ids) != n * size:
            parent = None  # vLLM sends exactly the blocks' tokens; anything else cannot be hashed safely
        for i, ehash in enumerate(event.block_hashes):
            if parent is not None and not event.plain[i]:
                c.not_plain += n - i
                parent = None  # the blocks after it chain from it, so they are not plain either
            if parent is not None:
                parent = block_hash(parent, event.token_ids[i * size : (i + 1) * size])
            self._put(ehash, parent)
        c.stored += n

    def _put(self, ehash: EngineHash, key: str | None) -> None:
        old = self._blocks.get(ehash, _MISSING)
        if old is not _MISSING:
            if old == key or key is None:
                return  # stored again (vLLM's "full" report mode re-reports reused blocks)
            if old is not None:
                self._unref(old)
        self._blocks[ehash] = key
        if key is not None:
            count = self._refs.get(key, 0)
            self._refs[key] = count + 1
            if count == 0:
                self.report.add(key)

    def _remove(self, ehash: EngineHash) -> None:
        key = self._blocks.pop(ehash, _MISSING)
        if key is _MISSING:
            self.counters.unknown_removed += 1
            return
        self.counters.removed += 1
        if key is not None:
            self._unref(key)

    def _unref(self, key: str) -> None:
        count = self._refs[key] - 1
        if count:
            self._refs[key] = count
        else:
            del self._refs[key]
            self.report.drop(key)


# --- the worker's report --------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    stored: dict[str, None] = field(default_factory=dict)
    """Held by an engine, not yet told to the leader (insertion-ordered set)."""
    removed: dict[str, None] = field(default_factory=dict)
    """Told to the leader, no longer held."""
    cleared: bool = False

    def __len__(self) -> int:
        return len(self.stored) + len(self.removed)


class KVReport:
    """What changed in the worker's engines' prefix caches since the previous heartbeat.

    ``held`` counts, per contract hash, the engines holding it, so a block two
    engines share leaves the report only when both drop it. Pending changes are
    relative to what the leader was last told: a block stored and removed inside
    one window cancels out, and so does one removed and stored again. Past
    ``max_pending`` changes the report starts over: ``cleared``, then the blocks
    held longest (those an LRU cache kept: the hot prefixes), up to half the
    bound. ``on_pending`` is called when changes wait, at most once per
    ``min_interval`` after a drain (the worker kicks an early heartbeat with it).
    """

    def __init__(
        self,
        *,
        max_pending: int = MAX_PENDING,
        on_pending: Callable[[], None] | None = None,
        min_interval: float = MIN_KICK_INTERVAL,
    ) -> None:
        if max_pending < 2:
            raise ValueError(f"max_pending must be at least 2 (got {max_pending})")
        self.max_pending = max_pending
        self.on_pending = on_pending
        self.min_interval = min_interval
        self.seq = 0
        """The last batch number drained; counts from 1 per worker boot and never repeats."""
        self.block_size = 0
        self.held: dict[str, int] = {}
        self.sources = 0
        """Engines attached (listening); while none is and nothing waits, heartbeats carry no ``kv_blocks``."""
        self.overflows = 0
        self._pending = _Pending()
        self._last_drain = float("-inf")
        self._timer: asyncio.TimerHandle | None = None

    # --- what engines say ---------------------------------------------------------------

    def attach(self) -> None:
        self.sources += 1

    def detach(self) -> None:
        self.sources = max(0, self.sources - 1)

    def adopt_block_size(self, size: int) -> bool:
        """True when blocks of ``size`` tokens can go in this report (one block size per worker)."""
        if size <= 0:
            return False
        if size == self.block_size:
            return True
        if self.block_size and self.held:
            return False  # another engine's blocks are reported at the other size; these cannot join them
        if self.block_size:
            self._start_over()  # hashes of the old size would never match a request again
        self.block_size = size
        return True

    def add(self, key: str) -> None:
        count = self.held.get(key, 0)
        self.held[key] = count + 1
        if count:
            return
        p = self._pending
        if key in p.removed:
            del p.removed[key]  # removed then stored again: the leader's view is right as it is
        else:
            p.stored[key] = None
            self._changed()

    def drop(self, key: str) -> None:
        count = self.held.get(key, 0)
        if count > 1:
            self.held[key] = count - 1
            return
        if not count:
            return
        del self.held[key]
        p = self._pending
        if key in p.stored:
            del p.stored[key]  # stored and removed inside one window: the leader need not hear of it
        elif not p.cleared:
            p.removed[key] = None
            self._changed()

    def forget(self, keys: Sequence[str], *, clear: bool) -> None:
        """One engine's blocks are gone. ``clear``: say ``cleared`` (resending the other engines' blocks);
        otherwise whichever is shorter, a removal of each or a clear."""
        for key in keys:
            count = self.held.get(key, 0)
            if count > 1:
                self.held[key] = count - 1
            elif count:
                del self.held[key]
                if clear:
                    continue
                if key in self._pending.stored:
                    del self._pending.stored[key]
                elif not self._pending.cleared:
                    self._pending.removed[key] = None
        if clear or len(self._pending) > self.max_pending or len(self._pending.removed) > len(self.held):
            self._start_over()
        self._changed()

    def resync(self) -> None:
        """The leader may have missed a batch (a heartbeat failed, or it forgot this node): start over."""
        self._start_over()
        self._changed()

    def _start_over(self) -> None:
        keep = self.max_pending // 2
        p = self._pending
        p.cleared = True
        p.removed.clear()
        p.stored = dict.fromkeys(key for key, _ in zip(self.held, range(keep)))

    def _changed(self) -> None:
        if len(self._pending) > self.max_pending:
            self.overflows += 1
            log.warning(
                "%d prefix-cache changes wait for a heartbeat; dropping them, the leader will rebuild",
                len(self._pending),
            )
            self._start_over()
        self._schedule_kick()

    # --- what the heartbeat takes --------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Changes waiting (stored + removed), plus one for a waiting ``cleared``."""
        return len(self._pending) + int(self._pending.cleared)

    def drain(self) -> KVBlocks | None:
        """This heartbeat's ``kv_blocks``; ``None`` (the key is left out) while no engine reports and nothing waits."""
        if not self.sources and not self.pending:
            return None
        p, self._pending = self._pending, _Pending()
        self.seq += 1
        self._last_drain = time.monotonic()
        if self._timer is not None:
            self._timer.cancel()  # the next change schedules its own kick, a full interval from now
            self._timer = None
        return KVBlocks(
            seq=self.seq,
            block_size=self.block_size,
            stored=list(p.stored) or None,
            removed=list(p.removed) or None,
            cleared=p.cleared,
        )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule_kick(self) -> None:
        if self.on_pending is None or self._timer is not None or not self.pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test feeding events by hand): the next heartbeat takes them
        delay = max(GATHER, self._last_drain + self.min_interval - time.monotonic())
        self._timer = loop.call_later(delay, self._kick)

    def _kick(self) -> None:
        self._timer = None
        if self.pending and self.on_pending is not None:
            self.on_pending()
