"""The oracle: the cache-hit rate a perfect router could reach, with the simulator's own cache rules."""

from __future__ import annotations

import asyncio

import pytest

from bench.routing.oracle import oracle_for_trace, pooled_lru_hits
from bench.routing.workloads import PrefixShape, shared_prefix_trace
from opod.contract.tokenizer import Tokenizer
from opod.sim.config import SimConfig
from opod.sim.engine import Engine
from opod.sim.textgen import Plan

BS = 4


def test_a_repeated_prompt_hits_every_full_block_but_its_last_token() -> None:
    prompt = list(range(10, 22))  # 12 tokens = 3 full blocks; the last token is always computed, so 2 blocks hit
    result = pooled_lru_hits([prompt, prompt], output_tokens=0, block_size=BS, capacity_blocks=100)
    assert result.prompt_tokens == 24 and result.hit_tokens == 8


def test_a_shared_prefix_hits_up_to_where_the_prompts_part() -> None:
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    b = [1, 2, 3, 4, 5, 6, 0, 0, 9]
    assert pooled_lru_hits([a, b], 0, BS, 100).hit_tokens == 4


def test_too_small_a_cache_forgets_the_least_recently_used_prefix() -> None:
    a, b = [1] * 8 + [9], [2] * 8 + [9]
    # Each prompt: two full blocks, and while it runs one more for its partial tail.
    assert pooled_lru_hits([a, b, a], 0, BS, capacity_blocks=5).hit_tokens == 8
    assert (
        pooled_lru_hits([a, b, a], 0, BS, capacity_blocks=4).hit_tokens == 4
    )  # b's admission evicted a's second block
    assert pooled_lru_hits([a, b, a], 0, BS, capacity_blocks=2).hit_tokens == 0


def test_answer_blocks_take_room_and_go_before_the_prompt() -> None:
    a, b = [1] * 8 + [9], [2] * 8 + [9]
    # An 8-token answer: three blocks reserved while it runs, two cached after it (never asked for again).
    assert pooled_lru_hits([a, b, a], output_tokens=8, block_size=BS, capacity_blocks=8).hit_tokens == 8
    assert pooled_lru_hits([a, b, a], output_tokens=8, block_size=BS, capacity_blocks=6).hit_tokens == 4
    assert pooled_lru_hits([a, b, a], output_tokens=8, block_size=BS, capacity_blocks=5).hit_tokens == 0


def test_more_workers_never_lower_the_oracle() -> None:
    shape = PrefixShape(
        groups=6,
        system_tokens=80,
        question_tokens=8,
        history_tokens=8,
        output_tokens=4,
        turns=2,
        rate=20.0,
        seconds=5.0,
    )
    messages = [r.messages for r in shared_prefix_trace(shape, seed=4)]
    rates = [
        oracle_for_trace(messages, shape.output_tokens, 16, workers, kv_blocks=16).hit_rate for workers in (1, 2, 4, 8)
    ]
    assert rates == sorted(rates) and rates[-1] > rates[0] > 0


@pytest.mark.parametrize("capacity", [40, 400])
def test_on_one_engine_the_oracle_equals_what_the_simulator_counts(capacity: int) -> None:
    """Requests one at a time through a real simulator engine hit exactly what the oracle predicts for one worker."""
    shape = PrefixShape(
        groups=3,
        system_tokens=40,
        question_tokens=6,
        history_tokens=6,
        output_tokens=5,
        turns=2,
        rate=10.0,
        seconds=3.0,
    )
    trace = shared_prefix_trace(shape, seed=5)
    expected = oracle_for_trace((r.messages for r in trace), shape.output_tokens, BS, workers=1, kv_blocks=capacity)
    engine = Engine(SimConfig(block_size=BS, kv_blocks=capacity, time_scale=0.0).validate())
    tokenizer = Tokenizer()

    async def replay() -> None:
        for r in trace:
            prompt = tokenizer.encode_chat(list(r.messages))
            answer = list(range(100, 100 + shape.output_tokens))
            seq = await engine.admit(
                prompt, Plan(ids=answer, pieces=[" x"] * len(answer), finish_reason="length"), shape.output_tokens
            )
            seq.produced = len(answer)
            seq.finish("length")

    asyncio.run(asyncio.wait_for(replay(), 10))  # a request the cache cannot hold would wait forever
    assert (engine.stats.prompt_tokens, engine.stats.cached_tokens) == (expected.prompt_tokens, expected.hit_tokens)
