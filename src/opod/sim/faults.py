"""Failure injection: errors, stalls and crashes, from seeded RNGs, changeable while running.

Which requests fail or stall is drawn from an RNG derived from the seed and the
request's arrival number, so a rerun with the same seed and the same traffic
fails the same requests. ``fail_next``/``stall_next`` make the next N requests
fail or stall for certain, for tests that need a failure on demand.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import asdict, dataclass
from typing import Any

from opod.sim.config import STALL_POINTS, SimConfig

__all__ = ["CRASH_EXIT_CODE", "Decision", "FaultError", "FaultInjector", "Faults"]

CRASH_EXIT_CODE = 17
"""The exit status of a crash on purpose, so a supervisor's logs tell it from a real one."""


class FaultError(ValueError):
    """A bad field in a ``POST /sim/faults`` body; the message names it."""


@dataclass(slots=True)
class Faults:
    fail_rate: float = 0.0
    fail_status: int = 500
    fail_next: int = 0
    stall_rate: float = 0.0
    stall_ms: float = 1000.0
    stall_at: str = "first"
    stall_next: int = 0
    crash_after: int | None = None
    crash_after_tokens: int | None = None

    @classmethod
    def from_config(cls, cfg: SimConfig) -> Faults:
        return cls(
            fail_rate=cfg.fail_rate,
            fail_status=cfg.fail_status,
            stall_rate=cfg.stall_rate,
            stall_ms=cfg.stall_ms,
            stall_at=cfg.stall_at,
            crash_after=cfg.crash_after,
            crash_after_tokens=cfg.crash_after_tokens,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def update(self, body: Any) -> None:
        """Apply the fields present in ``body``; check them all before changing anything."""
        if not isinstance(body, dict):
            raise FaultError('the body must be a JSON object of fault settings, e.g. {"fail_rate": 0.5}')
        known = set(self.to_json())
        unknown = sorted(set(body) - known)
        if unknown:
            raise FaultError(f"unknown field {unknown[0]!r}; known fields: {', '.join(sorted(known))}")
        staged = asdict(self)
        for name, value in body.items():
            staged[name] = _check(name, value)
        for name, value in staged.items():
            setattr(self, name, value)

    @property
    def quiet(self) -> bool:
        return not (
            self.fail_rate or self.fail_next or self.stall_rate or self.stall_next or self.crash_after is not None
        )


def _check(name: str, value: Any) -> Any:
    if name == "stall_at":
        if value not in STALL_POINTS:
            raise FaultError(f"stall_at must be one of {', '.join(STALL_POINTS)} (got {value!r})")
        return value
    if name in ("crash_after", "crash_after_tokens") and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(f"{name} must be a number (got {value!r})")
    if name in ("fail_rate", "stall_rate"):
        if not 0 <= value <= 1:
            raise FaultError(f"{name} must be between 0 and 1 (got {value})")
        return float(value)
    if name == "stall_ms":
        if value < 0:
            raise FaultError(f"stall_ms must not be negative (got {value})")
        return float(value)
    if value != int(value) or value < 0:
        raise FaultError(f"{name} must be a whole number ≥ 0 (got {value})")
    if name == "fail_status" and not 400 <= value <= 599:
        raise FaultError(f"fail_status must be an HTTP error status, 400–599 (got {value})")
    return int(value)


@dataclass(slots=True, frozen=True)
class Decision:
    fail: bool = False
    stall_first: float = 0.0
    """Seconds to stall before the first token."""
    stall_mid: float = 0.0
    """Seconds to stall halfway through the answer."""


NO_FAULT = Decision()


class FaultInjector:
    def __init__(self, cfg: SimConfig) -> None:
        self.faults = Faults.from_config(cfg)
        self.seed = cfg.seed
        self.arrivals = 0

    def on_request(self) -> Decision:
        """Called once per inference request, before any work; may end the process."""
        self.arrivals += 1
        f = self.faults
        if f.quiet:
            return NO_FAULT
        if f.crash_after is not None and self.arrivals > f.crash_after:
            crash(f"request {self.arrivals} arrived after crash_after={f.crash_after}")
        rng = random.Random(f"{self.seed}:fault:{self.arrivals}")
        fail = rng.random() < f.fail_rate
        stall = rng.random() < f.stall_rate
        if f.fail_next:
            f.fail_next -= 1
            fail = True
        elif f.stall_next:
            f.stall_next -= 1
            stall = True
        if fail:
            return Decision(fail=True)
        if stall:
            seconds = f.stall_ms / 1000.0
            return Decision(stall_first=seconds) if f.stall_at == "first" else Decision(stall_mid=seconds)
        return NO_FAULT

    def before_stream_token(self, sent: int) -> None:
        """Called before each streamed token; ends the process once ``crash_after_tokens`` were sent."""
        limit = self.faults.crash_after_tokens
        if limit is not None and sent >= limit:
            crash(f"a stream reached crash_after_tokens={limit}")


def crash(why: str) -> None:
    print(f"opod sim: crashing on purpose: {why}", file=sys.stderr, flush=True)
    os._exit(CRASH_EXIT_CODE)
