"""The block prefix cache: a fixed pool of KV blocks, named by the contract's chained block hashes.

It follows vLLM's block manager where a router can notice the difference:

* a request reuses the longest run of its leading full blocks that is cached,
  but never its whole prompt (at least one token is always computed);
* a running request holds its prompt blocks plus private blocks for its
  partial tail and its answer; usage is held blocks / total blocks;
* a finished request's full blocks (prompt and answer) stay cached with no
  holder, in an LRU queue, and are evicted only when the pool runs out; a
  request's blocks join the queue last-block-first, so a prefix outlives its tails;
* every change that a KV-event consumer must see goes to ``sink`` as vLLM's
  event maps (removals before stores).

Engine-side hashes (the integers in events) are the simulator's own: the last
8 bytes of SHA-256 over ``b"opod-sim:"`` and the contract hash's hex text.
They differ from the contract hash on purpose, as a real engine's do, so a
consumer has to recompute contract hashes from ``token_ids``.

A LoRA adapter's blocks are its own, as in vLLM: their chain starts from the
adapter's name instead of the seed, so they never match the base model's or
another adapter's, and their events carry ``lora_id`` and ``lora_name``.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opod.contract.blockhash import block_hash, block_hashes

__all__ = ["Allocation", "Block", "PrefixCache", "engine_hash"]

Event = dict[str, Any]


def engine_hash(key: str) -> int:
    """The uint64 the simulator publishes for the block whose contract hash is ``key``."""
    return int.from_bytes(hashlib.sha256(b"opod-sim:" + key.encode()).digest()[-8:], "big")


@dataclass(slots=True, eq=False)
class Block:
    key: str
    ehash: int
    refs: int = 0
    dropped: bool = False
    """Cleared from the index while a request still held it."""


@dataclass(slots=True, eq=False)
class Allocation:
    """What one running request holds."""

    blocks: list[Block] = field(default_factory=list)
    anon: int = 0
    """Private blocks: the prompt's partial tail and the answer's tokens."""
    hit_blocks: int = 0
    lora: str = ""
    """The adapter the request ran under; empty for the base model."""


def _chain_root(lora: str) -> str:
    """Where a request's block chain starts: the contract's seed for the base model, the adapter's name for an adapter."""
    return f"lora:{lora}" if lora else ""


def _stored(ehashes: list[int], parent: int | None, tokens: Sequence[int], block_size: int, lora: str = "") -> Event:
    return {
        "type": "BlockStored",
        "block_hashes": ehashes,
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": block_size,
        "lora_id": zlib.crc32(lora.encode()) & 0x7FFFFFFF if lora else None,
        "medium": "GPU",
        "lora_name": lora or None,
        "extra_keys": [None] * len(ehashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def _removed(ehash: int) -> Event:
    return {"type": "BlockRemoved", "block_hashes": [ehash], "medium": "GPU", "group_idx": 0}


class PrefixCache:
    def __init__(self, total_blocks: int, block_size: int, sink: Callable[[list[Event]], None] | None = None) -> None:
        self.total = total_blocks
        self.block_size = block_size
        self.sink = sink
        self._index: dict[str, Block] = {}
        self._free: OrderedDict[str, Block] = OrderedDict()
        """Cached blocks nobody holds, least recently used first."""
        self.held = 0
        """Blocks in use by running requests: held cached blocks, private blocks and dropped ones."""
        self._private = 0
        self._orphans = 0
        """Blocks a request still holds after a clear dropped them from the index."""

    # -- reading -------------------------------------------------------------------------------

    @property
    def cached(self) -> int:
        return len(self._index)

    @property
    def usage(self) -> float:
        return self.held / self.total

    def keys(self, tokens: Sequence[int], lora: str = "") -> list[str]:
        return block_hashes(tokens, self.block_size, _chain_root(lora))

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def contains(self, key: str) -> bool:
        return key in self._index

    # -- allocation ----------------------------------------------------------------------------

    def allocate(self, tokens: Sequence[int], keys: list[str], total_tokens: int, lora: str = "") -> Allocation | None:
        """Hold the blocks for a request of ``total_tokens`` (prompt and answer); ``None`` when the pool is full now."""
        index = self._index
        bs = self.block_size
        max_hits = min(len(keys), (len(tokens) - 1) // bs)
        hits = 0
        while hits < max_hits and keys[hits] in index:
            hits += 1
        present = [index.get(k) for k in keys]
        reused_free = sum(1 for b in present if b is not None and b.refs == 0)
        missing = sum(1 for b in present if b is None)
        anon = max(self.blocks_for(total_tokens) - len(keys), 0)
        room = self.total - len(index) - self._private - self._orphans + len(self._free) - reused_free
        if missing + anon > room:
            return None

        for b in present:
            if b is not None:
                self._hold(b)  # before making room, so that eviction cannot take them
        events: list[Event] = []
        self._make_room(missing + anon, events)
        emit = self.sink is not None
        held: list[Block] = []
        run: list[int] = []
        run_start = 0
        parent: int | None = None
        for i, (key, b) in enumerate(zip(keys, present)):
            if b is None:
                b = Block(key, engine_hash(key) if emit else 0)
                index[key] = b
                self._hold(b)
                if not run:
                    run_start = i
                run.append(b.ehash)
            elif run:
                events.append(_stored(run, parent, tokens[run_start * bs : (run_start + len(run)) * bs], bs, lora))
                run = []
            held.append(b)
            if not run:
                parent = b.ehash
        if run:
            events.append(_stored(run, parent, tokens[run_start * bs : (run_start + len(run)) * bs], bs, lora))
        self._private += anon
        self.held += anon
        if emit and events:
            self.sink(events)  # type: ignore[misc]
        return Allocation(blocks=held, anon=anon, hit_blocks=hits, lora=lora)

    def fits_at_all(self, total_tokens: int) -> bool:
        return self.blocks_for(total_tokens) <= self.total

    def finish(self, alloc: Allocation, tokens: Sequence[int], keys: list[str]) -> None:
        """Cache the answer's full blocks (``tokens`` = prompt + answer), then let go of everything."""
        bs = self.block_size
        full = len(tokens) // bs
        parent_key = keys[-1] if keys else _chain_root(alloc.lora)
        parent_hash = alloc.blocks[-1].ehash if alloc.blocks else None
        run: list[int] = []
        run_start = len(keys)
        events: list[Event] = []
        emit = self.sink is not None
        for j in range(len(keys), full):
            if alloc.anon == 0:
                break
            key = block_hash(parent_key, tokens[j * bs : (j + 1) * bs])
            parent_key = key
            b = self._index.get(key)
            alloc.anon -= 1
            self._private -= 1
            self.held -= 1
            if b is None:
                b = Block(key, engine_hash(key) if emit else 0)
                self._index[key] = b
                self._hold(b)
                if not run:
                    run_start = j
                run.append(b.ehash)
            else:
                self._hold(b)
                if run:
                    events.append(
                        _stored(run, parent_hash, tokens[run_start * bs : (run_start + len(run)) * bs], bs, alloc.lora)
                    )
                    run = []
            alloc.blocks.append(b)
            if not run:
                parent_hash = b.ehash
        if run:
            events.append(
                _stored(run, parent_hash, tokens[run_start * bs : (run_start + len(run)) * bs], bs, alloc.lora)
            )
        if emit and events:
            self.sink(events)  # type: ignore[misc]
        self.release(alloc)

    def release(self, alloc: Allocation) -> None:
        """Let go of a request's blocks; cached ones join the LRU queue, last block first."""
        self._private -= alloc.anon
        self.held -= alloc.anon
        alloc.anon = 0
        for b in reversed(alloc.blocks):
            b.refs -= 1
            if b.refs == 0:
                self.held -= 1
                if b.dropped:
                    self._orphans -= 1
                elif self._index.get(b.key) is b:
                    self._free[b.key] = b
        alloc.blocks = []

    def clear(self, force: bool = False) -> bool:
        """Forget every cached block (vLLM's reset_prefix_cache); without ``force`` only when nothing is held."""
        if self.held and not force:
            return False
        for b in self._index.values():
            if b.refs:
                b.dropped = True
                self._orphans += 1
        self._index.clear()
        self._free.clear()
        return True

    # -- internals -------------------------------------------------------------------------------

    def _hold(self, b: Block) -> None:
        if b.refs == 0:
            self.held += 1
            self._free.pop(b.key, None)
        b.refs += 1

    def _make_room(self, need: int, events: list[Event]) -> None:
        spare = self.total - len(self._index) - self._private - self._orphans
        while spare < need and self._free:
            key, b = self._free.popitem(last=False)
            del self._index[key]
            spare += 1
            if self.sink is not None:
                events.append(_removed(b.ehash))
