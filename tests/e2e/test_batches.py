"""OpenAI's Files and Batch API, through the ``openai`` package, on a leader built in the test's process with a
simulator worker.

A batch's lines are served like live requests (each has its usage row under the batch's key,
with the ``X-Request-Id`` ``<batch>-<line>``), a leader stopped midway resumes the batch without
sending an answered line again, a cancel stops it, and ``/api/v1/client-jobs`` shows its progress.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import openai
import pytest

from opod.ledger.ledger import COMMIT_EVERY_S, COMMIT_UNDER_LOAD_S
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, opod_cli, sim_worker, usage_rows, wait_until

MODEL = "sim-chat"
LINES = 200


class Fleet:
    def __init__(self, leader: Leader, worker: OpodProcess) -> None:
        self.leader = leader
        self.worker = worker

    def key(self, name: str) -> tuple[str, str]:
        status, body = self.leader.admin("POST", "/api/v1/keys", {"name": name})
        assert status == 201, body
        return body["id"], body["secret"]

    def client(self, secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.leader.url + "/v1", api_key=secret, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("batches")
    leader = Leader(root / "leader")
    worker = sim_worker(
        leader, root / "worker", "n_batch", OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 1.0, "output_max": 8})
    )
    fleet = Fleet(leader, worker)
    try:
        worker.wait_for_line("registered with", timeout=30)
        added = opod_cli(leader, "model", "add", MODEL, "--engine", "sim")
        assert added.returncode == 0, added.stderr
        leader.wait_served(MODEL, timeout=60)
        yield fleet
    finally:
        worker.stop()
        fleet.leader.stop()  # the resume test opens a second leader on the same home


def _input(n: int, tag: str) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 4},
            }
        )
        + "\n"
        for i in range(n)
    ).encode()


def _start(client: openai.OpenAI, n: int, tag: str):
    uploaded = client.files.create(file=(f"{tag}.jsonl", _input(n, tag)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0 and uploaded.status == "processed"
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"tag": tag}
    )


def _job(fleet: Fleet, batch_id: str) -> dict:
    status, body = fleet.leader.admin("GET", f"/api/v1/client-jobs/{batch_id.replace('batch_', 'job_', 1)}")
    assert status == 200, body
    return body


def _ended(client: openai.OpenAI, batch_id: str, timeout: float = 60):
    return wait_until(
        lambda: (
            (b := client.batches.retrieve(batch_id)).status in ("completed", "failed", "cancelled", "expired") and b
        ),
        timeout,
        f"batch {batch_id} to end",
    )


def _answers(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def _ok_rows(fleet: Fleet, batch_id: str) -> Counter[str]:
    return Counter(
        r.data.request_id
        for r in usage_rows(fleet.leader)
        if r.data.request_id.startswith(batch_id + "-") and r.data.outcome == "ok"
    )


def test_a_batch_of_200_lines_completes_and_each_line_is_served_once_under_its_key(fleet: Fleet) -> None:
    key_id, secret = fleet.key("batch-owner")
    client = fleet.client(secret)
    batch = _start(client, LINES, "full")
    assert (
        batch.status == "in_progress" and batch.endpoint == "/v1/chat/completions" and batch.metadata == {"tag": "full"}
    )
    done = _ended(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None and (
        done.request_counts.total,
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (LINES, LINES, 0)
    assert (
        done.completed_at
        and done.in_progress_at
        and done.error_file_id is None
        and done.usage
        and done.usage.output_tokens > 0
    )
    answers = _answers(client, done.output_file_id)
    assert Counter(a["custom_id"] for a in answers) == Counter(f"full-{i}" for i in range(LINES))
    assert all(
        a["response"]["status_code"] == 200
        and a["response"]["body"]["choices"][0]["message"]["content"]
        and a["error"] is None
        for a in answers
    )
    assert [b.id for b in client.batches.list()] == [batch.id]
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.bytes == len(client.files.content(done.output_file_id).content)

    # A line's usage row is offered once the ledger commits it, a moment after its answer is kept.
    lines = Counter(f"{batch.id}-{i + 1}" for i in range(LINES))
    wait_until(lambda: _ok_rows(fleet, batch.id) == lines, 10, "a usage row for every line, once")
    rows = [r for r in usage_rows(fleet.leader) if r.data.request_id.startswith(batch.id + "-")]
    assert {r.data.api_key_id for r in rows} == {key_id}, "the batch's requests are its key's"
    status, export = fleet.leader.admin("GET", "/api/v1/usage/export?by=key&format=json&period=month")
    assert status == 200, export
    assert sum(row["Requests"] for row in export if row["Key"] == key_id) == LINES, (
        "the batch's usage is in the export, once"
    )

    job = _job(fleet, batch.id)
    assert job["status"] == "completed" and job["progress"] == {
        "total": LINES,
        "completed": LINES,
        "failed": 0,
        "pending": 0,
    }
    assert job["key_id"] == key_id and job["output_file_id"] == done.output_file_id and job["model"] == MODEL
    status, listed = fleet.leader.admin("GET", "/api/v1/client-jobs?status=completed")
    assert status == 200 and batch.id.replace("batch_", "job_") in [j["id"] for j in listed]


def test_another_key_sees_none_of_it_and_bad_input_is_refused_or_fails_the_batch(fleet: Fleet) -> None:
    _, mine = fleet.key("owner")
    _, theirs = fleet.key("stranger")
    owner, stranger = fleet.client(mine), fleet.client(theirs)
    uploaded = owner.files.create(file=("in.jsonl", _input(2, "private")), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        stranger.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert uploaded.id not in [f.id for f in stranger.files.list()]
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        owner.batches.create(input_file_id=uploaded.id, endpoint="/v1/images", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        owner.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=fleet.leader.url + "/v1", api_key="sk-nope", max_retries=0).files.list()

    broken = (
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\nnot json\n'
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    )
    bad = owner.files.create(file=("bad.jsonl", broken), purpose="batch")
    failed = owner.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    assert [(e.line, e.code) for e in failed.errors.data] == [(2, "invalid_json_line"), (3, "duplicate_custom_id")]
    assert _job(fleet, failed.id)["status"] == "failed"
    assert owner.files.delete(bad.id).deleted
    with pytest.raises(openai.NotFoundError):
        owner.files.content(bad.id)


def test_cancel_stops_sending_and_the_lines_never_sent_are_in_the_error_file(fleet: Fleet) -> None:
    _, secret = fleet.key("canceller")
    client = fleet.client(secret)
    batch = _start(client, LINES, "cancel")
    wait_until(lambda: _job(fleet, batch.id)["progress"]["completed"] >= 10, 30, "some lines to be answered")
    status, cancelling = fleet.leader.admin(
        "POST", f"/api/v1/client-jobs/{batch.id.replace('batch_', 'job_', 1)}/cancel", {}
    )
    assert status == 200 and cancelling["status"] in ("cancelling", "cancelled"), cancelling
    done = _ended(client, batch.id, timeout=30)
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
    counts = done.request_counts
    assert counts is not None and 10 <= counts.completed < LINES, counts
    answered = _answers(client, done.output_file_id)
    skipped = _answers(client, done.error_file_id)
    assert len(answered) == counts.completed and len(answered) + len(skipped) == LINES
    assert all(s["error"]["code"] == "batch_cancelled" and s["response"] is None for s in skipped)
    completed = counts.completed
    wait_until(lambda: sum(_ok_rows(fleet, batch.id).values()) >= completed, 10, "a usage row for every line answered")
    time.sleep(COMMIT_UNDER_LOAD_S + 2 * COMMIT_EVERY_S)  # a line sent after the cancel ended would have its row by now
    assert sum(_ok_rows(fleet, batch.id).values()) == completed, "no line was sent after the cancel ended"
    assert client.batches.cancel(batch.id).status == "cancelled", "cancelling an ended batch changes nothing"


def test_a_batch_resumes_after_the_leader_stops_midway_and_no_line_is_answered_twice(
    fleet: Fleet, tmp_path: Path
) -> None:
    _, secret = fleet.key("resumer")
    client = fleet.client(secret)
    batch = _start(client, LINES, "resume")
    wait_until(lambda: _job(fleet, batch.id)["progress"]["completed"] >= 30, 30, "some lines to be answered")
    fleet.leader = fleet.leader.restart()  # raises if the leader did not stop cleanly
    before = _job(fleet, batch.id)["progress"]["completed"]
    assert 30 <= before < LINES, f"the stop came too late to test a resume ({before} answered)"
    client = fleet.client(secret)
    done = _ended(client, batch.id, timeout=90)
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == LINES, (
        done
    )
    answers = _answers(client, done.output_file_id)
    assert Counter(a["custom_id"] for a in answers) == Counter(f"resume-{i}" for i in range(LINES))
    # A line's usage row is offered on the stream once the ledger commits it, a moment after its answer is kept.
    lines = {f"{batch.id}-{i + 1}" for i in range(LINES)}

    def every_row() -> Counter[str] | None:
        rows = _ok_rows(fleet, batch.id)
        return rows if set(rows) >= lines else None

    ok = wait_until(every_row, 10, "a usage row for every line")
    assert set(ok) == lines and set(ok.values()) == {1}, (
        f"lines served twice: {[rid for rid, n in ok.items() if n > 1][:5]}"
    )
    status, _, _ = http("GET", fleet.leader.url + "/v1/models", key=fleet.leader.key)
    assert status == 200
