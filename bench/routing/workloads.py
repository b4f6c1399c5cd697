"""The three workloads, generated up front from a seed so every path replays exactly the same requests.

1. short chat: one small non-streamed chat request, sent back to back (closed
   loop) or at Poisson arrivals (open loop);
2. streamed chat: a longer streamed answer, at Poisson arrivals;
3. shared prefix: shaped like llm-d's capacity benchmark (a few long system
   prompts shared by many users, a unique question per request) and multi-turn:
   sessions start at Poisson arrivals, each turn re-sends the conversation so
   far and is sent an exponential time after the previous one. The
   assistant turns in the history are written by the workload, not taken from
   the engine's answers, so the trace (and the oracle computed from it) is
   known before the run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

MODEL = "sim-chat"


def short_chat_body(model: str = MODEL, max_tokens: int = 8) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hello there, how are you"}],
            "max_tokens": max_tokens,
        }
    ).encode()


def stream_chat_body(model: str = MODEL, max_tokens: int = 32) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "tell me a story about a fleet of engines"}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def distinct_chat_bodies(count: int, max_tokens: int = 8, stream: bool = False) -> list[bytes]:
    """``count`` chats that each open with their own number: no router can place one by a prefix it saw, so a
    comparison measures the routers' own cost and their load balance, not their cache affinity."""
    out = []
    for i in range(count):
        body: dict[str, object] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{i}: hello there, how are you"}],
            "max_tokens": max_tokens,
        }
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        out.append(json.dumps(body).encode())
    return out


def poisson_arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of a Poisson process at ``rate`` per second."""
    if rate <= 0 or seconds <= 0:
        return []
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(t)


# -- workload 3: shared prefix, multi-turn -----------------------------------------------------


@dataclass(frozen=True)
class PrefixShape:
    """The shared-prefix workload's knobs (llm-d's X-37 profile scaled to a 2-core machine)."""

    groups: int = 16
    """Distinct long system prompts (llm-d: num_groups)."""
    system_tokens: int = 1000
    """Words per system prompt; each word is one token of the simulator's tokenizer (llm-d: 8,000)."""
    question_tokens: int = 50
    """Words per user question, unique to each request (llm-d: 1,000)."""
    history_tokens: int = 50
    """Words per assistant turn written into the history of the following turns."""
    output_tokens: int = 32
    """max_tokens of every answer (llm-d: 1,000)."""
    turns: int = 3
    """Requests per user session; turn k re-sends turns 1..k-1."""
    rate: float = 96.0
    """Offered requests per second, all sessions together: past what round robin carries (about 48 here) and
    within what cache-aware placement carries, the load at which llm-d compares its routers."""
    seconds: float = 60.0
    """Sessions start during this many seconds (their later turns may come after)."""
    think_s: float = 2.0
    """Mean time from one turn's send to the session's next turn (exponential), answer time included."""


@dataclass(frozen=True)
class TraceRequest:
    at: float
    """Seconds from the start of the phase."""
    session: int
    group: int
    turn: int
    messages: tuple[dict, ...]
    body: bytes = field(repr=False)


def _words(rng: random.Random, n: int) -> str:
    # Letters only, one leading space each: the simulator's tokenizer makes each one token.
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(" " + "".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(n))


def shared_prefix_trace(shape: PrefixShape, seed: int, model: str = MODEL) -> list[TraceRequest]:
    """Every request of workload 3 in send order; the same seed gives the same bytes."""
    rng = random.Random(seed)
    systems = [f"You are assistant number {g}." + _words(rng, shape.system_tokens) for g in range(shape.groups)]
    session_rate = shape.rate / max(shape.turns, 1)
    starts = poisson_arrivals(session_rate, shape.seconds, seed + 1)
    out: list[TraceRequest] = []
    for session, start in enumerate(starts):
        group = rng.randrange(shape.groups)
        history: list[dict] = [{"role": "system", "content": systems[group]}]
        at = start
        for turn in range(shape.turns):
            history.append(
                {"role": "user", "content": f"Question {session}.{turn}:" + _words(rng, shape.question_tokens)}
            )
            messages = tuple(dict(m) for m in history)
            body = json.dumps(
                {
                    "model": model,
                    "messages": list(messages),
                    "max_tokens": shape.output_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            ).encode()
            out.append(TraceRequest(at, session, group, turn, messages, body))
            history.append({"role": "assistant", "content": _words(rng, shape.history_tokens)})
            at += rng.expovariate(1.0 / shape.think_s) if shape.think_s > 0 else 0.0
    out.sort(key=lambda r: (r.at, r.session, r.turn))
    return out
