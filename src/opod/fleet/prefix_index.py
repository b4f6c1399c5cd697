"""Which worker's engine holds which prompt prefix: the leader's index of reported KV-cache blocks.

Workers report their engines' cache changes as the contract's chained block
hashes (``Heartbeat.kv_blocks``); a hash names a whole prefix, so "worker W
holds the first k blocks of this request" is k lookups. Each block's holders are
one integer, a bit per worker, so following a prompt's blocks costs one ``&`` per
block however many workers hold them. The index is bounded:
each worker's blocks are kept in least-recently-reported order and the oldest
go first past ``per_worker`` blocks or ``max_age`` seconds. A gap in a
worker's batch counter, a new boot, or ``cleared`` drops everything held for
that worker, which is rebuilt from what follows (an empty index routes like no
index; a wrong one routes worse than none).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress

from opod.contract import adminapi, nodeapi


@dataclass(slots=True)
class _Worker:
    slot: int
    """This worker's bit in the holder masks: ``1 << slot``."""
    blocks: OrderedDict[str, float] = field(default_factory=OrderedDict)
    seq: int = 0
    boot_id: str = ""
    block_size: int = 0


class PrefixIndex:
    def __init__(self, per_worker: int = 500_000, max_age: float = 3600.0) -> None:
        self.per_worker = per_worker
        self.max_age = max_age
        self._workers: dict[str, _Worker] = {}
        self._holders: dict[str, int] = {}
        """Block hash → the workers holding it, as a mask of their slots' bits."""
        self._slot_ids: list[str] = []
        """Slot → the worker in it (``""``: free, a forgotten worker's, taken by the next new one)."""
        self.resets = 0
        """How many times a worker's blocks were dropped to rebuild (gaps, boots, cleared)."""
        self.generation = 0
        """Changes when a worker starts or stops reporting, or its block size changes: what readers may cache by."""

    # --- what workers report -----------------------------------------------------

    def apply(self, node_id: str, boot_id: str, kv: nodeapi.KVBlocks, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        worker = self._workers.get(node_id)
        if worker is None:
            worker = self._workers[node_id] = _Worker(self._take_slot(node_id), boot_id=boot_id)
            self.generation += 1
        if worker.boot_id != boot_id or kv.cleared or (worker.seq and kv.seq != worker.seq + 1):
            self._drop(worker)
            worker.boot_id = boot_id
        worker.seq = kv.seq
        if kv.block_size and kv.block_size != worker.block_size:
            worker.block_size = kv.block_size
            self.generation += 1
        bit = 1 << worker.slot
        for digest in kv.removed or ():
            if worker.blocks.pop(digest, None) is not None:
                self._unhold(digest, bit)
        holders = self._holders
        for digest in kv.stored or ():
            if digest in worker.blocks:
                worker.blocks.move_to_end(digest)
            else:
                holders[digest] = holders.get(digest, 0) | bit
            worker.blocks[digest] = now
        while len(worker.blocks) > self.per_worker:
            digest, _ = worker.blocks.popitem(last=False)
            self._unhold(digest, bit)

    def forget(self, node_id: str) -> None:
        worker = self._workers.pop(node_id, None)
        if worker is not None:
            self.generation += 1
            self._drop(worker)
            self._slot_ids[worker.slot] = ""

    def sweep(self, now: float | None = None) -> int:
        """Drop blocks reported longer ago than ``max_age``; returns how many went."""
        now = time.monotonic() if now is None else now
        horizon = now - self.max_age
        dropped = 0
        for worker in self._workers.values():
            bit = 1 << worker.slot
            while worker.blocks:
                digest, seen = next(iter(worker.blocks.items()))
                if seen >= horizon:
                    break
                worker.blocks.popitem(last=False)
                self._unhold(digest, bit)
                dropped += 1
        return dropped

    def _drop(self, worker: _Worker) -> None:
        if worker.blocks:
            self.resets += 1
        bit = 1 << worker.slot
        for digest in worker.blocks:
            self._unhold(digest, bit)
        worker.blocks.clear()
        worker.seq = 0

    def _unhold(self, digest: str, bit: int) -> None:
        holders = self._holders.get(digest)
        if holders is not None:
            holders &= ~bit
            if holders:
                self._holders[digest] = holders
            else:
                del self._holders[digest]

    def _take_slot(self, node_id: str) -> int:
        slots = self._slot_ids
        for slot, taken in enumerate(slots):
            if not taken:
                slots[slot] = node_id
                return slot
        slots.append(node_id)
        return len(slots) - 1

    # --- what the router asks ---------------------------------------------------------

    def touch(self, node_id: str, hashes: Sequence[str], now: float | None = None) -> None:
        """The engine is about to hit these blocks: they are fresh again.

        A cache hit produces no event, so without this a prefix in steady use would
        age out of the index while the engine still holds it.
        """
        worker = self._workers.get(node_id)
        if worker is None:
            return
        now = time.monotonic() if now is None else now
        blocks = worker.blocks
        for digest in hashes:
            if digest not in blocks:
                break
            blocks[digest] = now
            blocks.move_to_end(digest)

    def block_size(self, node_ids: Sequence[str]) -> int:
        """The block size these workers report (the first one known); 0 = none reports."""
        for node_id in node_ids:
            worker = self._workers.get(node_id)
            if worker is not None and worker.block_size:
                return worker.block_size
        return 0

    def reports(self, node_id: str) -> bool:
        return node_id in self._workers

    def leading_blocks(self, hashes: Sequence[str]) -> dict[str, int]:
        """For each worker holding the first block, how many leading blocks of ``hashes`` it holds in a row."""
        if not hashes:
            return {}
        holders_of = self._holders.get
        alive = holders_of(hashes[0], 0)
        if not alive:
            return {}
        ids = self._slot_ids
        run: dict[str, int] = {}
        for depth, digest in enumerate(hashes[1:], start=1):
            still = alive & holders_of(digest, 0)
            if still != alive:
                _name(alive & ~still, depth, ids, run)  # these workers' runs end here
                alive = still
                if not alive:
                    return run
        _name(alive, len(hashes), ids, run)
        return run

    def stats(self) -> adminapi.PrefixIndex | None:
        """What ``/loadz`` says; ``None`` while no worker reports cache events."""
        if not self._workers:
            return None
        return adminapi.PrefixIndex(
            workers_reporting=len(self._workers), blocks=sum(len(w.blocks) for w in self._workers.values())
        )


_BITS = bytes.maketrans(b"01", b"\x00\x01")


def _name(mask: int, depth: int, ids: list[str], run: dict[str, int]) -> None:
    """``run[id] = depth`` for each worker whose bit is in ``mask``."""
    if not mask & (mask - 1):
        run[ids[mask.bit_length() - 1]] = depth
        return
    # Several at once: the mask's bits, lowest first, pick the ids in C.
    run.update(dict.fromkeys(compress(ids, bin(mask)[:1:-1].encode().translate(_BITS)), depth))
