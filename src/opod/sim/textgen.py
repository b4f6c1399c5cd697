"""What a request will answer: its words, its length and why it stops, all from seeded RNGs.

The answer's RNG is derived from the simulator's seed and the request itself
(its prompt ids, its token budget and its own ``seed`` field), so the same
request gets the same answer whatever else the simulator serves, and a different
``--seed`` gives different answers.
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from opod.contract.tokenizer import Tokenizer

__all__ = ["CallSpan", "Plan", "plan_answer", "plan_tool_answer", "request_rng"]

_WORDS = (
    "the of and to in is that it for was on are as with his they at be this have from or one had by word but not "
    "what all were we when your can said there use an each which she do how their if will up other about out many "
    "then them these so some her would make like him into time has look two more write go see number no way could "
    "people my than first water been call who oil its now find long down day did get come made may part over new "
    "sound take only little work know place year live me back give most very after thing our just name good "
    "sentence man think say great where help through much before line right too mean old any same tell boy follow "
    "came want show also around form three small set put end does another well large must big even such because "
    "turn here why ask went men read need land different home us move try kind hand picture again change off play "
    "spell air away animal house point page letter mother answer found study still learn should river light "
    "model token cache block route engine fleet prompt batch queue latency memory worker leader node signal"
).split()
_PUNCT = (",", ".", ";", "!", "?")


@dataclass(slots=True)
class Plan:
    """The answer a request will produce."""

    pieces: list[str]
    ids: list[int]
    finish_reason: str
    """``stop`` when the answer ended by itself, ``length`` when the token budget cut it,
    ``tool_calls`` when it is complete tool calls."""
    calls: list[CallSpan] = field(default_factory=list)
    """For an answer that calls tools: each call, its pieces being its arguments' text."""


@dataclass(frozen=True, slots=True)
class CallSpan:
    """One tool call of a plan: ``pieces[start:end]`` are its arguments."""

    id: str
    name: str
    start: int
    end: int


def request_rng(seed: int, prompt: Sequence[int], extra: str = "") -> random.Random:
    """An RNG owned by one request: the same simulator seed and the same request give the same stream."""
    h = hashlib.blake2b(f"{seed}|{extra}|".encode(), digest_size=16)
    h.update(array("q", prompt).tobytes())
    return random.Random(int.from_bytes(h.digest(), "big"))


def _random_pieces(rng: random.Random, n: int) -> list[str]:
    rand = rng.random
    words = rng.choices(_WORDS, k=n)
    out: list[str] = []
    capital = True
    for i, w in enumerate(words):
        if i and not capital and rand() < 0.12:
            p = _PUNCT[int(rand() * len(_PUNCT))]
            out.append(p)
            capital = p in ".!?"
        elif capital:
            out.append(w.capitalize() if i == 0 else " " + w.capitalize())
            capital = False
        else:
            out.append(" " + w)
    return out


def _echo_pieces(tokenizer: Tokenizer, text: str, n: int) -> list[str]:
    source = tokenizer.pieces(text.strip()) or ["…"]
    # Each repetition starts with a space so that the answer re-tokenizes to the same pieces.
    again = [" " + source[0]] + source[1:] if source[0][:1].isalnum() else source
    return [(source if i < len(source) else again)[i % len(source)] for i in range(n)]


def plan_answer(
    tokenizer: Tokenizer,
    rng: random.Random,
    *,
    budget: int,
    output_min: int,
    output_max: int,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    echo_text: str | None = None,
) -> Plan:
    """Draw the natural length, cut it at ``budget`` and build the pieces."""
    natural = rng.randint(output_min, output_max)
    natural = max(natural, min_tokens)
    if ignore_eos or natural > budget:
        n, reason = budget, "length"
    else:
        n, reason = natural, "stop"
    pieces = _random_pieces(rng, n) if echo_text is None else _echo_pieces(tokenizer, echo_text, n)
    pid = tokenizer.piece_id
    return Plan(pieces=pieces, ids=[pid(p) for p in pieces], finish_reason=reason)


def plan_tool_answer(
    tokenizer: Tokenizer, rng: random.Random, calls: Sequence[tuple[str, str]], *, budget: int
) -> Plan:
    """An answer made of tool calls (name, arguments JSON): each call's arguments as pieces, cut at ``budget``."""
    pieces: list[str] = []
    spans: list[CallSpan] = []
    for name, arguments in calls:
        start = len(pieces)
        pieces += tokenizer.pieces(arguments)
        spans.append(CallSpan(f"call_{rng.getrandbits(96):024x}", name, start, len(pieces)))
    reason = "tool_calls"
    if len(pieces) > budget:
        pieces, reason = pieces[:budget], "length"
        spans = [CallSpan(s.id, s.name, s.start, min(s.end, budget)) for s in spans if s.start < budget]
    pid = tokenizer.piece_id
    return Plan(pieces=pieces, ids=[pid(p) for p in pieces], finish_reason=reason, calls=spans)
