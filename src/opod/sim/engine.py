"""The simulated engine: admission, the running batch, the waiting queue, sleep, and what it counts.

A request is admitted when a batch slot is free (``max_batch``) and the prefix
cache can hold its blocks; otherwise it waits, first come first served, and is
counted as waiting. A sleeping engine admits nothing until it wakes. The engine
never sleeps itself when latency is off, so with a zero latency model a request
costs only its bookkeeping.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Mapping

from opod.contract.tokenizer import Tokenizer
from opod.sim.config import SimConfig
from opod.sim.latency import LatencyModel
from opod.sim.prefix_cache import Allocation, Event, PrefixCache
from opod.sim.stats import Stats, sglang_buckets, vllm_buckets
from opod.sim.textgen import Plan

__all__ = ["Engine", "Sequence"]

_now = time.monotonic


class Sequence:
    """One admitted request, from admission to its last token."""

    __slots__ = (
        "engine",
        "prompt",
        "keys",
        "plan",
        "alloc",
        "slot",
        "arrived",
        "admitted",
        "first_at",
        "last_at",
        "produced",
        "cached_tokens",
        "max_tokens",
        "done",
        "task_id",
        "due",
    )

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        keys: list[str],
        plan: Plan,
        alloc: Allocation,
        arrived: float,
        max_tokens: int,
    ) -> None:
        self.engine = engine
        self.prompt = prompt
        self.keys = keys
        self.plan = plan
        self.alloc = alloc
        self.arrived = arrived
        self.admitted = _now()
        self.first_at = 0.0
        self.last_at = 0.0
        self.produced = 0
        self.cached_tokens = alloc.hit_blocks * engine.cache.block_size
        self.max_tokens = max_tokens
        self.done = False
        self.slot = -1
        self.task_id = 0
        self.due = self.admitted
        """When the latest token is due (monotonic seconds): each is due a step after the one before it."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    async def wait_first(self, extra: float = 0.0) -> None:
        """Until the first token is due: the prefill time for the uncached part of the prompt after
        admission (plus an injected stall)."""
        self.due = self.admitted + self.engine.latency.prefill(len(self.prompt) - self.cached_tokens) + extra
        await _until(self.due)

    async def wait_next(self, extra: float = 0.0) -> None:
        """Until the next token is due: one decode step (at the batch's present size) after the last
        one was due, so a wake-up that came late shortens the next wait instead of delaying every
        token after it, as an engine's own steps would not wait for a process it shares a CPU with."""
        self.due += self.engine.latency.decode_step(self.engine.running) + extra
        await _until(self.due)

    def emit(self, n: int = 1) -> None:
        """``n`` tokens were produced now."""
        now = _now()
        stats = self.engine.stats
        if self.produced == 0:
            self.first_at = now
            stats.ttft.observe(now - self.arrived)
            stats.prompt_seconds += now - self.admitted
            n_rest = n - 1
        else:
            n_rest = n
        if n_rest:
            stats.itl.observe((now - (self.last_at or now)) / n_rest, n_rest)
            stats.decode_steps += n_rest
            stats.busy_at_decode += self.engine.running * n_rest
        self.last_at = now
        self.produced += n
        stats.generation_tokens += n

    def finish(self, reason: str) -> None:
        """Record the request and give back its slot and blocks; safe to call twice."""
        if self.done:
            return
        self.done = True
        engine = self.engine
        now = _now()
        stats = engine.stats
        stats.finished[reason] = stats.finished.get(reason, 0) + 1
        stats.e2e.observe(now - self.arrived)
        stats.queue.observe(self.admitted - self.arrived)
        stats.inference.observe(now - self.admitted)
        stats.gen_len.observe(self.produced)
        stats.max_tokens.observe(self.max_tokens)
        stats.params_n.observe(1)
        if self.produced:
            stats.prefill.observe(self.first_at - self.admitted)
            stats.decode.observe(now - self.first_at)
            stats.decode_seconds += now - self.first_at
            if self.produced > 1:
                stats.tpot.observe((now - self.first_at) / (self.produced - 1))
        total = len(self.prompt) + self.produced
        if total > stats.max_sequence:
            stats.max_sequence = total
        if reason in ("stop", "length"):
            engine.cache.finish(self.alloc, self.prompt + self.plan.ids[: self.produced], self.keys)
        else:
            engine.cache.release(self.alloc)
        engine._leave(self)


async def _until(deadline: float) -> None:
    delay = deadline - _now()
    if delay > 0:
        await asyncio.sleep(delay)


class Engine:
    def __init__(
        self,
        cfg: SimConfig,
        event_sink: Callable[[list[Event]], None] | None = None,
        on_step: Callable[[], None] | None = None,
        adapters: Mapping[str, str] | None = None,
    ) -> None:
        """``adapters``: the LoRA adapters served now (name → path), a live view of what the state
        attaches at run time; a request for one runs under it."""
        self.cfg = cfg
        self.tokenizer = Tokenizer()
        self.cache = PrefixCache(cfg.kv_blocks, cfg.block_size, sink=event_sink)
        self.latency = LatencyModel(cfg)
        buckets = sglang_buckets if cfg.dialect == "sglang" else vllm_buckets
        self.stats = Stats(buckets(cfg.max_model_len))
        self.running = 0
        self.sleep_level = 0
        self._on_step = on_step
        self._waiters: collections.deque[tuple[asyncio.Future[Allocation], list[int], list[str], int, str]] = (
            collections.deque()
        )
        self.adapters: Mapping[str, str] = adapters if adapters is not None else {}
        self._slots: list[Sequence | None] = [None] * cfg.max_batch
        self._free_slots = list(range(cfg.max_batch - 1, -1, -1))
        self._tasks = 0

    # -- reading -------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w[0].done())

    @property
    def kv_usage(self) -> float:
        return self.cache.usage

    def slot_table(self) -> list[Sequence | None]:
        return list(self._slots)

    def fits(self, prompt_tokens: int, answer_tokens: int) -> bool:
        return self.cache.fits_at_all(prompt_tokens + answer_tokens)

    # -- admission -----------------------------------------------------------------------------

    async def admit(self, prompt: list[int], plan: Plan, max_tokens: int, lora: str = "") -> Sequence:
        """Wait for a batch slot and room in the cache; the caller must ``finish`` the sequence.

        ``lora``: the adapter the request runs under, whose cached blocks are its own.
        """
        arrived = _now()
        if self._on_step is not None:
            self._on_step()  # what waited for a scheduler step (a cache clear) goes out before this request's events
        keys = self.cache.keys(prompt, lora)
        total = len(prompt) + len(plan.ids)
        alloc: Allocation | None = None
        if not self._waiters and not self.sleep_level and self.running < self.cfg.max_batch:
            alloc = self.cache.allocate(prompt, keys, total, lora)
            if alloc is not None:
                self.running += 1
        if alloc is None:
            fut: asyncio.Future[Allocation] = asyncio.get_running_loop().create_future()
            entry = (fut, prompt, keys, total, lora)
            self._waiters.append(entry)
            self._pump()  # admits it at once when only given-up requests were ahead of it
            try:
                alloc = await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.cache.release(fut.result())
                    self.running -= 1
                    self._pump()
                else:
                    self._waiters.remove(entry)
                raise
        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += len(prompt)
        hit = alloc.hit_blocks * self.cfg.block_size
        stats.cached_tokens += hit
        stats.last_hit_rate = hit / len(prompt) if prompt else 0.0
        stats.prompt_len.observe(len(prompt))
        stats.prefill_computed.observe(len(prompt) - hit)
        seq = Sequence(self, prompt, keys, plan, alloc, arrived, max_tokens)
        seq.slot = self._free_slots.pop()
        self._slots[seq.slot] = seq
        self._tasks += 1
        seq.task_id = self._tasks
        return seq

    def _leave(self, seq: Sequence) -> None:
        self.running -= 1
        if seq.slot >= 0:
            self._slots[seq.slot] = None
            self._free_slots.append(seq.slot)
        if self._waiters:
            self._pump()

    def _pump(self) -> None:
        """Admit waiting requests in arrival order while there is room."""
        waiters = self._waiters
        while waiters and not self.sleep_level and self.running < self.cfg.max_batch:
            fut, prompt, keys, total, lora = waiters[0]
            if fut.done():
                waiters.popleft()
                continue
            alloc = self.cache.allocate(prompt, keys, total, lora)
            if alloc is None:
                return
            waiters.popleft()
            self.running += 1
            fut.set_result(alloc)

    # -- sleep and cache control ---------------------------------------------------------------

    def sleep(self, level: int) -> None:
        """Stop admitting and drop the prefix cache, as vLLM's ``/sleep`` does."""
        self.sleep_level = max(level, 1)
        self.cache.clear(force=True)

    def wake(self) -> None:
        self.sleep_level = 0
        self._pump()

    def reset_prefix_cache(self) -> bool:
        return self.cache.clear(force=False)
