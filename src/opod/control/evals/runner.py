"""One run of a suite: each case sent through ``/v1`` as any client's request, its answer scored and kept.

Every case is a chat completion served in process by the gateway (the route's rules, admission,
routing, budgets, a usage row) as the system's own request: the admin key, ``user`` ``opod-eval``
and the run's id and case in ``metadata`` (the usage row's end user and tags), request id
``<run>-<seq>``. Cases run ``concurrency`` at a time; each is written to the store as it is
scored, so a run's progress is readable while it runs and its evidence outlives its leader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from opod.control.evals.scoring import PASS_AT, Verdict, judge_prompt, read_grade, score
from opod.control.evals.suites import Case, Suite
from opod.store import Store
from opod.store.evals import EvalCaseRecord, EvalRunRecord
from opod.store.offloop import run_sync

log = logging.getLogger("opod.evals")

Ask = Callable[[str, bytes, str], Awaitable[tuple[int, bytes]]]
"""(path, body, request id) → (status, body): a ``/v1`` request served in process as the system's own."""
CHAT = "/v1/chat/completions"
END_USER = "opod-eval"
"""The ``user`` every case is sent with: the usage rows of quality runs say so."""
JUDGE_MAX_TOKENS = 64


@dataclass(frozen=True, slots=True)
class Plan:
    """A run to make: the suite, who answers, how it passes."""

    suite: Suite
    model: str
    """The model the run is about (the gate's, the one a candidate would replace)."""
    target: str
    """The catalog model asked; ``model`` itself unless a candidate answers for it."""
    threshold: float
    judge: str
    concurrency: int
    by: str
    job: str = ""


@dataclass(frozen=True, slots=True)
class Tally:
    score: float
    passed: bool
    below: int
    errors: int


def tally(results: Iterable[EvalCaseRecord], threshold: float) -> Tally:
    """The cases' scores weighed (a case without an answer scores 0), and the counts the spec names."""
    cases = list(results)
    weight = sum(c.weight for c in cases)
    total = sum(c.score * c.weight for c in cases if not c.error) / weight if weight else 0.0
    errors = sum(1 for c in cases if c.error)
    below = sum(1 for c in cases if not c.error and c.score < PASS_AT)
    return Tally(total, bool(cases) and total >= threshold - 1e-12, below, errors)


class LiveRun:
    """A run in progress on this leader: its record, and each case once it is scored."""

    def __init__(self, record: EvalRunRecord) -> None:
        self.record = record
        self.results: dict[int, EvalCaseRecord] = {}
        self.finished = asyncio.Event()

    def view(self) -> EvalRunRecord:
        """The run as it stands: ``done`` cases of ``cases``, and the score of those done so far."""
        if self.finished.is_set():
            return self.record
        results = tuple(self.results[k] for k in sorted(self.results))
        counts = tally(results, self.record.threshold)
        return replace(
            self.record,
            done=len(results),
            results=results,
            score=counts.score,
            below=counts.below,
            errors=counts.errors,
            took_ms=int((time.time() - self.record.at.timestamp()) * 1000),
        )


def _answer(status: int, data: bytes) -> tuple[str, str]:
    """(the answer's text, "") or ("", why there is none)."""
    try:
        body: Any = json.loads(data) if data else None
    except ValueError:
        body = None
    if status != 200:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
        return "", f"the gateway answered {status}: {message or data[:200].decode(errors='replace')}"
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        content = None
    if not isinstance(content, str):
        return "", "the answer held no message text"
    return content, ""


def _messages(system: str, prompt: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


class Runner:
    """Makes runs: asks each case, scores it, keeps it."""

    def __init__(self, store: Store, ask: Ask) -> None:
        self.store = store
        self.ask = ask

    async def _send(self, plan: Plan, run_id: str, request_id: str, body: dict[str, Any], role: str) -> tuple[str, str]:
        body = {
            **body,
            "temperature": 0,
            "stream": False,
            "user": END_USER,
            "metadata": {"eval_run": run_id, "eval_suite": plan.suite.name, "eval_role": role},
        }
        try:
            status, data = await self.ask(CHAT, json.dumps(body).encode(), request_id)
        except Exception as err:  # a failure of the leader, not of the model: the case says so
            log.exception("quality run %s: asking %s failed in the leader", run_id, request_id)
            return "", f"the leader failed sending the request: {err}"
        return _answer(status, data)

    async def _judge(self, plan: Plan, run_id: str, seq: int, case: Case, answer: str) -> tuple[Verdict | None, str]:
        body = {
            "model": plan.judge,
            "messages": _messages("", judge_prompt(case, answer)),
            "max_tokens": JUDGE_MAX_TOKENS,
        }
        reply, error = await self._send(plan, run_id, f"{run_id}-{seq}-judge", body, "judge")
        if error:
            return None, f"the judge {plan.judge} could not grade: {error}"
        verdict = read_grade(reply)
        if verdict is None:
            return None, f"the judge {plan.judge}'s reply held no grade from 0 to 10: {reply[:120]!r}"
        return verdict, ""

    async def _case(self, plan: Plan, run_id: str, seq: int, case: Case) -> EvalCaseRecord:
        request_id = f"{run_id}-{seq}"
        started = time.monotonic()
        body = {
            "model": plan.target,
            "messages": _messages(case.system, case.prompt),
            "max_tokens": case.max_tokens,
        }
        answer, error = await self._send(plan, run_id, request_id, body, "case")
        verdict: Verdict | None = None
        if not error:
            if case.kind == "rubric":
                verdict, error = await self._judge(plan, run_id, seq, case, answer)
            else:
                verdict = score(case, answer)
        return EvalCaseRecord(
            seq=seq,
            case_id=case.id,
            kind=case.kind,
            weight=case.weight,
            prompt=case.prompt,
            expected=case.expected,
            answer=answer,
            score=verdict.score if verdict is not None else 0.0,
            passed=verdict.passed if verdict is not None else False,
            detail=verdict.detail if verdict is not None else "",
            error=error,
            took_ms=int((time.monotonic() - started) * 1000),
            request_id=request_id,
        )

    async def execute(self, plan: Plan, live: LiveRun) -> EvalRunRecord:
        """Ask every case, keep each, and write the run's end; answers the finished record (with its cases)."""
        run_id = live.record.id
        slots = asyncio.Semaphore(plan.concurrency)
        started = time.monotonic()

        async def one(seq: int, case: Case) -> None:
            async with slots:
                result = await self._case(plan, run_id, seq, case)
            # Shielded: a scored case is kept even when the run is cancelled meanwhile.
            await asyncio.shield(run_sync(self.store.add_eval_case, run_id, result))
            live.results[seq] = result

        try:
            await asyncio.gather(*(one(seq, case) for seq, case in enumerate(plan.suite.cases)))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the store refused a case: the run cannot be scored
            log.exception("quality run %s failed", run_id)
            return await self._end(live, started, f"the run stopped on an error: {err}")
        return await self._end(live, started, "")

    async def _end(self, live: LiveRun, started: float, error: str) -> EvalRunRecord:
        results = tuple(live.results[k] for k in sorted(live.results))
        counts = tally(results, live.record.threshold)
        if not error and results and counts.errors == len(results):
            error = f"no case got an answer; the first: {results[0].error}"
        record = replace(
            live.record,
            state="failed" if error else "done",
            error=error,
            took_ms=int((time.monotonic() - started) * 1000),
            score=counts.score,
            passed=counts.passed and not error,
            below=counts.below,
            errors=counts.errors,
            done=len(results),
            results=results,
        )
        await asyncio.shield(run_sync(self.store.finish_eval_run, record))
        live.record = record
        live.finished.set()
        return record
