"""The leader's prefix index: matches leading blocks by the contract's hashes, stays bounded, rebuilds on gaps."""

from __future__ import annotations

import random

from opod.contract.blockhash import block_hashes
from opod.contract.nodeapi import KVBlocks
from opod.fleet.prefix_index import PrefixIndex

SYSTEM = list(range(1000, 1064))  # 4 blocks of 16 shared by every request
BS = 16


def hashes(tokens: list[int]) -> list[str]:
    return block_hashes(tokens, BS)


def stored(seq: int, tokens: list[int], **kw) -> KVBlocks:
    return KVBlocks(seq=seq, block_size=BS, stored=hashes(tokens), **kw)


def test_leading_blocks_are_counted_in_a_row_from_the_first() -> None:
    index = PrefixIndex()
    alice = SYSTEM + list(range(1, 33))
    bob = SYSTEM + list(range(500, 532))
    index.apply("w1", "b", stored(1, alice))
    index.apply("w2", "b", stored(1, SYSTEM))
    assert index.leading_blocks(hashes(alice)) == {"w1": 6, "w2": 4}
    assert index.leading_blocks(hashes(bob)) == {"w1": 4, "w2": 4}, "a different tail shares only the system prompt"
    other = [9] + SYSTEM[1:]
    assert index.leading_blocks(hashes(other)) == {}, (
        "a hash names the whole prefix: changing the first token matches nothing"
    )
    assert index.block_size(["w1"]) == BS and index.reports("w1") and not index.reports("w3")


def test_removed_blocks_and_a_hole_stop_the_run() -> None:
    index = PrefixIndex()
    tokens = SYSTEM + list(range(1, 33))
    index.apply("w1", "b", stored(1, tokens))
    index.apply("w1", "b", KVBlocks(seq=2, block_size=BS, removed=[hashes(tokens)[2]]))
    assert index.leading_blocks(hashes(tokens)) == {"w1": 2}


def test_a_gap_a_new_boot_or_cleared_drops_the_worker_and_rebuilds() -> None:
    index = PrefixIndex()
    index.apply("w1", "b1", stored(1, SYSTEM))
    index.apply("w1", "b1", stored(3, SYSTEM[:16]))  # seq 2 was lost
    assert index.leading_blocks(hashes(SYSTEM)) == {"w1": 1} and index.resets == 1
    index.apply("w1", "b2", stored(1, SYSTEM[:32]))  # the worker restarted
    assert index.leading_blocks(hashes(SYSTEM)) == {"w1": 2}
    index.apply("w1", "b2", KVBlocks(seq=2, block_size=BS, cleared=True))
    assert index.leading_blocks(hashes(SYSTEM)) == {}
    index.forget("w1")
    assert index.stats() is None


def test_memory_is_bounded_per_worker_and_by_age() -> None:
    index = PrefixIndex(per_worker=100, max_age=10.0)
    for seq in range(1, 21):
        index.apply(
            "w1",
            "b",
            KVBlocks(seq=seq, block_size=BS, stored=hashes(list(range(seq * 1000, seq * 1000 + 160)))),
            now=float(seq),
        )
    stats = index.stats()
    assert stats.blocks == 100 and stats.workers_reporting == 1
    # The newest 100 blocks were reported at t=11..20, 10 at a time; at t=25 those before t=15 are too old.
    assert index.sweep(now=25.0) == 40
    assert index.stats().blocks == 60


def test_leading_blocks_match_a_walk_of_each_workers_blocks_through_random_reports() -> None:
    # Stores, removals that leave holes, restarts, forgotten workers whose places are taken by new ones:
    # after each report the index must say what walking each worker's own blocks from the first says.
    rng = random.Random(7)
    prompt = hashes(list(range(16 * 40)))
    index = PrefixIndex()
    held: dict[str, set[str]] = {}
    seqs: dict[str, int] = {}
    for step in range(600):
        node_id = f"w{rng.randrange(12)}"
        action = rng.random()
        if action < 0.05:
            index.forget(node_id)
            held.pop(node_id, None)
            seqs.pop(node_id, None)
            continue
        seq = seqs.get(node_id, 0) + 1
        seqs[node_id] = seq
        mine = held.setdefault(node_id, set())
        if action < 0.6:
            blocks = prompt[: rng.randrange(1, len(prompt) + 1)]
            index.apply(node_id, "b", KVBlocks(seq=seq, block_size=BS, stored=blocks))
            mine.update(blocks)
        else:
            gone = rng.sample(sorted(mine), min(len(mine), rng.randrange(1, 4))) if mine else []
            index.apply(node_id, "b", KVBlocks(seq=seq, block_size=BS, removed=gone))
            mine.difference_update(gone)
        expected = {}
        for worker, blocks in held.items():
            run = next((i for i, digest in enumerate(prompt) if digest not in blocks), len(prompt))
            if run:
                expected[worker] = run
        assert index.leading_blocks(prompt) == expected, f"after step {step}"
    assert index.leading_blocks(prompt[:1]) == {worker: 1 for worker, blocks in held.items() if prompt[0] in blocks}
