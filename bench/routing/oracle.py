"""The oracle: the prefix-cache hit rate a perfect router could reach on a trace.

A router can at best make the fleet behave like one cache as large as all the
workers' caches together: every prefix lives on the worker that will be asked
for it again, and no worker holds a copy another already has. So the oracle
replays the trace, in send order, through one LRU block cache of
``workers × kv_blocks`` blocks that follows the simulator's own rules:

* a request reuses the longest run of its leading full blocks that is cached,
  never its whole prompt (at least one token is computed);
* after it, its prompt's full blocks and its answer's full blocks are cached;
  the answer's blocks and the prompt's tail are the first to go, the prompt's
  first block the last (the simulator queues blocks last-first on release).

Hit rate = cached prompt tokens / prompt tokens, as the engines count it
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``). It ignores the
blocks that requests in flight pin, so it is an upper bound in practice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opod.contract.blockhash import block_hashes
from opod.contract.tokenizer import Tokenizer


@dataclass(frozen=True)
class OracleResult:
    prompt_tokens: int
    hit_tokens: int
    capacity_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def pooled_lru_hits(
    prompts: Iterable[Sequence[int]], output_tokens: int, block_size: int, capacity_blocks: int
) -> OracleResult:
    """Replay token prompts (in order) through one LRU cache of ``capacity_blocks`` blocks."""
    lru: OrderedDict[object, None] = OrderedDict()
    """Cached blocks, least recently used first."""
    prompt_total = hit_total = 0
    junk = 0
    for tokens in prompts:
        keys = block_hashes(tokens, block_size)
        max_hits = min(len(keys), (len(tokens) - 1) // block_size) if tokens else 0
        hits = 0
        while hits < max_hits and keys[hits] in lru:
            hits += 1
        prompt_total += len(tokens)
        hit_total += hits * block_size
        # Admission, as the simulator does it: the cached blocks it will use are held (not evictable), and
        # room is made for the missing ones plus every block of the answer and the prompt's partial tail.
        held = [k for k in keys if k in lru]
        for k in held:
            del lru[k]
        reserve = -(-(len(tokens) + output_tokens) // block_size) - len(keys)
        need = len(keys) - len(held) + max(reserve, 0)
        while capacity_blocks - len(lru) - len(held) < need and lru:
            lru.popitem(last=False)
        # Release: the answer's full blocks are cached (nobody asks for them again: the next turn's history is
        # the workload's own text), then the prompt's blocks, last first, so a prefix outlives its tails.
        answer_blocks = (len(tokens) + output_tokens) // block_size - len(keys)
        for _ in range(max(answer_blocks, 0)):
            junk += 1
            lru[("answer", junk)] = None
        for key in reversed(keys):
            lru[key] = None
    return OracleResult(prompt_total, hit_total, capacity_blocks)


def oracle_for_trace(
    messages: Iterable[Sequence[dict]], output_tokens: int, block_size: int, workers: int, kv_blocks: int
) -> OracleResult:
    """The oracle for chat requests, tokenized the way the simulator tokenizes them."""
    tokenizer = Tokenizer()
    prompts = (tokenizer.encode_chat(list(m)) for m in messages)
    return pooled_lru_hits(prompts, output_tokens, block_size, workers * kv_blocks)
