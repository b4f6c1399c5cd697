"""The block prefix cache: hits on shared prefixes, LRU eviction, held blocks, and what it tells KV-event consumers."""

from __future__ import annotations

import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from opod.contract.blockhash import block_hashes
from opod.sim.prefix_cache import PrefixCache, engine_hash


def _metric(url: str, name: str) -> float:
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not in /metrics")


def _ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_repeated_long_prompt_hits_the_cache_and_gets_its_first_token_sooner(sim) -> None:
    h = sim(prefill_ms_per_token=0.6, ttft_ms=1.0, itl_ms=0.5)
    c = openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0)
    system = " ".join(f"rule{i}" for i in range(300))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "question"}]

    def ttft() -> tuple[float, int]:
        start = time.perf_counter()
        stream = c.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
        first = None
        usage = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            usage = chunk.usage or usage
        return first, usage.prompt_tokens_details.cached_tokens

    cold, cold_cached = ttft()
    hits_before = _metric(h.url, "vllm:prefix_cache_hits_total")
    warm, warm_cached = ttft()
    assert cold_cached == 0 and warm_cached >= 288  # every full block but the last one
    assert _metric(h.url, "vllm:prefix_cache_hits_total") - hits_before == warm_cached
    assert _metric(h.url, "vllm:prefix_cache_queries_total") >= 2 * 300
    assert cold > 0.15 and warm < cold / 3, (cold, warm)


def test_least_recently_used_blocks_are_evicted_when_the_cache_is_full(sim) -> None:
    h = sim(kv_blocks=30, block_size=16, output_min=1, output_max=1)
    c = openai.OpenAI(base_url=h.url + "/v1", api_key="x", max_retries=0)

    def cached(prompt: list[int]) -> int:
        return c.completions.create(
            model="sim-model", prompt=prompt, max_tokens=1
        ).usage.prompt_tokens_details.cached_tokens

    a, b, big = _ids(1000, 160), _ids(5000, 160), _ids(9000, 320)
    assert cached(a) == 0 and cached(b) == 0
    assert cached(a) == 144  # A is now the most recently used
    assert cached(big) == 0  # needs 21 of 30 blocks: B goes first, then A's tail
    assert cached(a) == 144
    assert cached(b) == 0


def test_running_requests_hold_blocks_and_usage_returns_to_zero(sim) -> None:
    h = sim(kv_blocks=100, block_size=16, itl_ms=20.0, output_min=40, output_max=40)
    with httpx.stream(
        "POST",
        h.url + "/v1/completions",
        json={"model": "sim-model", "prompt": _ids(100, 64), "max_tokens": 30, "stream": True},
    ) as r:
        lines = r.iter_lines()
        next(lines)
        usage = _metric(h.url, "vllm:kv_cache_usage_perc")
        assert _metric(h.url, "vllm:num_requests_running") == 1
        for _ in lines:
            pass
    assert usage == 6 / 100  # 64 prompt + 30 answer tokens need 6 blocks of 16
    assert _metric(h.url, "vllm:kv_cache_usage_perc") == 0.0
    assert _metric(h.url, "vllm:num_requests_running") == 0


def test_blocks_carry_contract_hashes_and_events_let_a_consumer_recompute_them() -> None:
    batches: list[list[dict]] = []
    cache = PrefixCache(total_blocks=6, block_size=4, sink=batches.append)
    tokens = _ids(10, 10)  # two full blocks and a partial one
    keys = cache.keys(tokens)
    assert keys == block_hashes(tokens, 4)
    alloc = cache.allocate(tokens, keys, total_tokens=12)
    assert alloc is not None and alloc.hit_blocks == 0 and cache.held == 3
    [stored] = batches.pop()
    assert stored["type"] == "BlockStored" and stored["parent_block_hash"] is None
    assert stored["block_hashes"] == [engine_hash(k) for k in keys]
    assert stored["token_ids"] == tokens[:8] and block_hashes(stored["token_ids"], 4) == keys
    cache.finish(alloc, tokens + [99, 98], keys)  # the answer fills the third block: it is cached too
    [tail] = batches.pop()
    assert tail["parent_block_hash"] == engine_hash(keys[1]) and tail["token_ids"] == [18, 19, 99, 98]
    assert cache.held == 0 and cache.cached == 3 and cache.usage == 0.0


def test_a_hit_never_covers_the_whole_prompt_and_eviction_precedes_storage() -> None:
    batches: list[list[dict]] = []
    cache = PrefixCache(total_blocks=4, block_size=4, sink=batches.append)
    first = _ids(0, 8)
    alloc = cache.allocate(first, cache.keys(first), 8)
    cache.release(alloc)
    again = cache.allocate(first, cache.keys(first), 8)
    assert again.hit_blocks == 1  # the last block is recomputed, as vLLM does
    cache.release(again)
    batches.clear()
    other = _ids(100, 16)
    alloc = cache.allocate(other, cache.keys(other), 16)
    assert alloc is not None
    [batch] = batches
    kinds = [e["type"] for e in batch]
    assert kinds == ["BlockRemoved", "BlockRemoved", "BlockStored"]
    assert all(len(e["block_hashes"]) == 1 for e in batch[:2])
    assert batch[0]["block_hashes"] == [engine_hash(cache.keys(first)[1])]  # the tail goes before its prefix


def test_a_full_cache_makes_requests_wait_instead_of_evicting_held_blocks() -> None:
    cache = PrefixCache(total_blocks=3, block_size=4)
    a = cache.allocate(_ids(0, 8), cache.keys(_ids(0, 8)), 12)
    assert a is not None and cache.usage == 1.0
    assert cache.allocate(_ids(50, 4), cache.keys(_ids(50, 4)), 4) is None
    cache.release(a)
    assert cache.allocate(_ids(50, 4), cache.keys(_ids(50, 4)), 4) is not None


def test_an_adapters_blocks_are_its_own_and_say_so_in_their_events() -> None:
    batches: list[list[dict]] = []
    cache = PrefixCache(total_blocks=12, block_size=4, sink=batches.append)
    tokens = _ids(10, 10)
    base = cache.keys(tokens)
    cache.finish(cache.allocate(tokens, base, total_tokens=10), tokens, base)
    batches.clear()
    sql = cache.keys(tokens, "base:sql")
    assert len(sql) == 2 and not set(sql) & set(base) and sql != cache.keys(tokens, "base:legal")
    alloc = cache.allocate(tokens, sql, total_tokens=14, lora="base:sql")
    assert alloc is not None and alloc.hit_blocks == 0, "the base model's cached blocks are not the adapter's"
    [stored] = batches.pop()
    assert (stored["lora_name"], stored["block_hashes"]) == ("base:sql", [engine_hash(k) for k in sql])
    assert isinstance(stored["lora_id"], int)
    cache.finish(alloc, tokens + [7, 7], sql)
    [tail] = batches.pop()
    assert tail["lora_name"] == "base:sql" and tail["parent_block_hash"] == engine_hash(sql[1])
    assert cache.allocate(tokens, sql, total_tokens=10, lora="base:sql").hit_blocks == 2
