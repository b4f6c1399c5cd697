"""Driving one request through the engine: its plan, admission, token timing, faults, and the end.

The framing (OpenAI SSE, Ollama NDJSON, a JSON body) is the caller's; this
module only hands out the answer's pieces at the pace the latency model sets.
"""

from __future__ import annotations

import random
import time

from opod.sim.engine import Engine, Sequence
from opod.sim.faults import Decision
from opod.sim.parse import GenRequest
from opod.sim.textgen import Plan, plan_answer, plan_tool_answer, request_rng

__all__ = ["TokenRun", "make_plan"]


def make_plan(engine: Engine, req: GenRequest, kind: str, choice: int = 0) -> tuple[Plan, random.Random]:
    """The answer of choice ``choice`` and its RNG (choice 0's also draws the response id)."""
    cfg = engine.cfg
    extra = f"{kind}|{req.model}|{req.asked_max_tokens}|{req.seed}|{req.min_tokens}|{req.ignore_eos}" + (
        f"|choice {choice}" if choice else ""
    )
    rng = request_rng(cfg.seed, req.prompt, extra)
    if req.tool_calls:
        return plan_tool_answer(
            engine.tokenizer, rng, [(c.name, c.arguments) for c in req.tool_calls], budget=req.max_tokens
        ), rng
    plan = plan_answer(
        engine.tokenizer,
        rng,
        budget=req.max_tokens,
        output_min=cfg.output_min,
        output_max=cfg.output_max,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        echo_text=req.echo_text if cfg.mode == "echo" else None,
    )
    return plan, rng


class TokenRun:
    """One admitted request handing out its pieces; ``close`` must be called in a ``finally``."""

    __slots__ = ("engine", "req", "plan", "decision", "seq", "sent", "started", "first_at")

    def __init__(self, engine: Engine, req: GenRequest, plan: Plan, decision: Decision) -> None:
        self.engine = engine
        self.req = req
        self.plan = plan
        self.decision = decision
        self.seq: Sequence | None = None
        self.sent = 0
        self.started = time.monotonic()
        self.first_at = 0.0

    @property
    def cached_tokens(self) -> int:
        return self.seq.cached_tokens if self.seq is not None else 0

    async def start(self) -> None:
        """Wait for admission and prefill: returns when the first token is ready."""
        lora = self.req.model if self.req.model in self.engine.adapters else ""
        self.seq = await self.engine.admit(self.req.prompt, self.plan, self.req.max_tokens, lora)
        await self.seq.wait_first(self.decision.stall_first)
        self.first_at = time.monotonic()

    async def next_piece(self) -> str | None:
        """The next piece, after its decode step; ``None`` once the answer is complete."""
        i = self.sent
        pieces = self.plan.pieces
        if i >= len(pieces):
            return None
        assert self.seq is not None
        if i:
            stall = self.decision.stall_mid if i == len(pieces) // 2 else 0.0
            await self.seq.wait_next(stall)
        self.seq.emit()
        self.sent = i + 1
        return pieces[i]

    async def run_all(self) -> str:
        """Produce the whole answer (a non-streamed request) and return its text."""
        await self.start()
        assert self.seq is not None
        n = len(self.plan.pieces)
        if self.engine.latency.active or self.decision.stall_mid:
            while await self.next_piece() is not None:
                pass
        elif n:
            self.seq.emit(n)
            self.sent = n
        return "".join(self.plan.pieces)

    def close(self) -> None:
        """Finish the sequence: complete when every piece went out, aborted otherwise."""
        if self.seq is not None:
            self.seq.finish(self.plan.finish_reason if self.sent >= len(self.plan.pieces) else "abort")

    @property
    def prompt_ms(self) -> float:
        return (self.first_at - self.started) * 1000.0 if self.first_at else 0.0

    @property
    def predicted_ms(self) -> float:
        return (time.monotonic() - self.first_at) * 1000.0 if self.first_at else 0.0
