"""Block hashes: the pinned upstream vectors and the chaining rules (CONTRACT.md §4.7)."""

from __future__ import annotations

from opod.contract.blockhash import BLOCK_HASH_SEED, block_hash, block_hashes

TOKENS = [i * 7 for i in range(40)]
PINNED_FIRST = "adc5456162d616d8"
PINNED_SECOND = "1604d6dafa155320"


def test_pinned_vectors() -> None:
    hashes = block_hashes(TOKENS, 16)
    assert hashes == [PINNED_FIRST, PINNED_SECOND]
    assert hashes == [block_hash("", TOKENS[:16]), block_hash(block_hash("", TOKENS[:16]), TOKENS[16:32])]


def test_a_hash_depends_on_everything_before_it() -> None:
    changed = [999] + TOKENS[1:]
    hashes = block_hashes(changed, 16)
    assert hashes[1] != PINNED_SECOND
    assert hashes == ["284a8e05178f0281", "ca5b4002f93afec4"]


def test_partial_blocks_and_bad_sizes_give_nothing() -> None:
    assert block_hashes(TOKENS, 0) == []
    assert block_hashes(TOKENS, -3) == []
    assert block_hashes(TOKENS[:15], 16) == []
    assert len(block_hashes(TOKENS, 16)) == len(TOKENS) // 16


def test_seed_negative_tokens_and_self_check_vectors() -> None:
    assert block_hash(BLOCK_HASH_SEED, [0, 1, 2]) == block_hash("", [0, 1, 2]) == "c2b1194fd8971969"
    assert block_hash("", []) == "1b3c95d4a5729c46"
    assert block_hash("", [-1]) == "a90245e9c1f3b0a4"
    assert block_hashes([1, 2, 3], 1) == ["fe65e41fdcee66a0", "fc9392937987de54", "6e9f85d5fcccf7b4"]
    assert block_hashes(list(range(10)), 4) == ["c4287deae0a67cd6", "f563bbdf5f985414"]


def test_a_long_prompt_chains_exactly_as_block_by_block() -> None:
    tokens = [(i * 7919) % 151_000 for i in range(1000)] + [-1, 2**64 - 1, 2**63]
    for size, parent in ((16, ""), (7, ""), (16, "a-lora-chain")):
        expected, chained = [], parent
        for start in range(0, len(tokens) - size + 1, size):
            chained = block_hash(chained, tokens[start : start + size])
            expected.append(chained)
        assert block_hashes(tokens, size, parent) == expected
