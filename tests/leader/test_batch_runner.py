"""The batch runner over a real store, with the serve path replaced by an engine double at its edge.

What a user of ``/v1/batches`` would notice: a runner killed mid-batch and a new one on the same
store finish it with no answered line sent again; refusals that say "later" are retried, others are
final and land in the error file; a batch whose window ends is expired with the unsent lines named; an idle
runner reads nothing until another leader creates a batch, which it then runs.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

from starlette.responses import Response

from opod.access.keytable import KeyEntry
from opod.leader.batches import LOOK_EVERY, BatchRunner
from opod.store import Store
from opod.store.client_jobs import JobLine
from opod.store.following import Following
from tests.store.conftest import Statements


class Engine:
    """Answers each request like a chat engine; ``status`` picks the answer per line."""

    def __init__(self, delay: float = 0.005, status=lambda line, tries: 200) -> None:
        self.delay = delay
        self.status = status
        self.calls: Counter[int] = Counter()

    async def serve_as(self, caller: KeyEntry | None, path: str, body: bytes, request_id: str, klass: str) -> Response:
        assert klass == "sheddable", "batch lines run behind live requests"
        line = int(request_id.rsplit("-", 1)[1])
        self.calls[line] += 1
        await asyncio.sleep(self.delay)
        status = self.status(line, self.calls[line])
        if status == 200:
            answer = {
                "choices": [{"message": {"content": json.loads(body)["messages"][0]["content"]}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            }
        else:
            code = "insufficient_quota" if status == 429 and line % 2 else "busy"
            answer = {"error": {"message": "no", "type": "x", "param": None, "code": code}}
        return Response(json.dumps(answer), status_code=status, media_type="application/json")


def _batch(store: Store, n: int, window: timedelta = timedelta(hours=24)) -> str:
    source = store.add_file(owner_key_id="", project_id="", purpose="batch", filename="in", content=b"{}")
    lines = [
        JobLine(i, f"c{i}", json.dumps({"model": "m", "messages": [{"role": "user", "content": f"n{i}"}]}))
        for i in range(1, n + 1)
    ]
    return store.create_client_job(
        owner_key_id="",
        project_id="",
        endpoint="/v1/chat/completions",
        model="m",
        input_file_id=source.id,
        completion_window=window,
        window_text="24h",
        metadata_json="{}",
        lines=lines,
    ).id


def _runner(store: Store, engine: Engine) -> BatchRunner:
    return BatchRunner(store, engine.serve_as, lambda key_id: None, "host:/home", concurrency=4)


async def _until(condition, what: str, timeout: float = 20) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def _until_ended(store: Store, job_id: str) -> None:
    await _until(lambda: (job := store.get_client_job(job_id)) is not None and job.ended, f"batch {job_id} to end")


def _jsonl(store: Store, file_id: str | None) -> list[dict]:
    return (
        [] if file_id is None else [json.loads(x) for x in (store.file_content(file_id) or b"").decode().splitlines()]
    )


async def test_a_runner_killed_midway_is_resumed_by_the_next_with_no_answered_line_sent_again(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'db'}")
    job_id = _batch(store, 120)
    first = Engine()
    stop = asyncio.Event()
    task = asyncio.create_task(_runner(store, first).run(stop))
    await _until(lambda: store.get_client_job(job_id).completed >= 40, "40 lines answered")  # type: ignore[union-attr]
    task.cancel()  # as a crash: nothing is let finish
    await asyncio.gather(task, return_exceptions=True)
    answered_before = {line.line for line in store.job_lines(job_id) if line.state == "answered"}
    assert 40 <= len(answered_before) < 120

    second = Engine()
    stop = asyncio.Event()
    task = asyncio.create_task(_runner(store, second).run(stop))
    await _until_ended(store, job_id)
    stop.set()
    await task
    job = store.get_client_job(job_id)
    assert job is not None and (job.status, job.completed, job.failed) == ("completed", 120, 0)
    assert not answered_before & set(second.calls), "a line answered before the kill is never sent again"
    resent = set(first.calls) & set(second.calls)
    assert len(resent) <= 4, "only the lines in flight at the kill are sent twice"
    output = _jsonl(store, job.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"c{i}" for i in range(1, 121))
    assert all(
        o["response"]["status_code"] == 200 and o["response"]["request_id"] == f"{job_id}-{o['custom_id'][1:]}"
        for o in output
    )
    assert (job.prompt_tokens, job.completion_tokens) == (360, 240)
    store.close()


async def test_later_refusals_are_retried_and_the_others_are_final(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'db'}")
    job_id = _batch(store, 6)
    # line 1: 503 twice then 200; line 2: a 429 that says "busy" once; line 3: spent budget; line 4: 400.
    plan = {
        1: lambda t: 503 if t <= 2 else 200,
        2: lambda t: 429 if t == 1 else 200,
        3: lambda t: 429,
        4: lambda t: 400,
    }
    engine = Engine(status=lambda line, tries: plan.get(line, lambda t: 200)(tries))
    stop = asyncio.Event()
    task = asyncio.create_task(_runner(store, engine).run(stop))
    await _until_ended(store, job_id)
    stop.set()
    await task
    job = store.get_client_job(job_id)
    assert job is not None and (job.status, job.completed, job.failed) == ("completed", 4, 2)
    assert engine.calls[1] == 3 and engine.calls[2] == 2 and engine.calls[3] == 1 and engine.calls[4] == 1
    errors = {e["custom_id"]: e["response"]["status_code"] for e in _jsonl(store, job.error_file_id)}
    assert errors == {"c3": 429, "c4": 400}
    store.close()


async def test_a_batch_whose_window_ends_is_expired_with_its_unsent_lines_named(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'db'}")
    job_id = _batch(store, 3, window=timedelta(seconds=1))
    engine = Engine(status=lambda line, tries: 200 if line == 1 else 503)
    stop = asyncio.Event()
    task = asyncio.create_task(_runner(store, engine).run(stop))
    await _until_ended(store, job_id)
    stop.set()
    await task
    job = store.get_client_job(job_id)
    assert (
        job is not None and (job.status, job.completed, job.failed) == ("expired", 1, 2) and job.expired_at is not None
    )
    assert {e["custom_id"]: e["error"]["code"] for e in _jsonl(store, job.error_file_id)} == {
        "c2": "batch_expired",
        "c3": "batch_expired",
    }
    store.close()


async def test_an_idle_runner_reads_nothing_until_another_leader_creates_a_batch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db'}"
    with Store.open(url) as ours, Store.open(url) as theirs:
        engine = Engine()
        runner = _runner(ours, engine)
        following = Following(ours)
        following.add("the batches left", runner.follow)
        statements = Statements(ours)
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        # The first look (a restart takes its jobs back): a claim, and whether any job is left elsewhere.
        await _until(lambda: sum("client_jobs" in s for s in statements) >= 3, "the runner's first look")
        assert await following.look() == ["the batches left"]
        statements.clear()
        await asyncio.sleep(LOOK_EVERY * 1.5)
        assert await following.look() == []
        assert statements == [], "no claim and no read while no batch has work left"
        statements.stop()

        job_id = await asyncio.to_thread(_batch, theirs, 3)
        assert await following.look() == ["the batches left"]
        await _until_ended(ours, job_id)
        stop.set()
        await task
        job = ours.get_client_job(job_id)
        assert job is not None and (job.status, job.completed) == ("completed", 3)
        assert engine.calls == {1: 1, 2: 1, 3: 1}


async def test_a_runner_that_looks_by_itself_is_not_asked_again_by_the_following(tmp_path: Path) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'db'}") as store:
        runner = _runner(store, Engine())  # before its first look it counts work as left, so it looks each second
        statements = Statements(store)
        assert await runner.follow() is True
        assert statements == [], "the runner's own looks already see a batch; the following adds no read"
        statements.stop()
