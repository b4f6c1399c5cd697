"""Long work on the console, followed on its page: a model's rolling restart and the clients' batches.

A leader in this process with its own simulator worker and a second ``opod join`` one (a model's
replacement starts beside the replica it replaces, so a restart needs two nodes). A restart asked on
a model's page is ``POST /api/v1/restart`` audited ``source: web`` with the person as the actor, and
its replicas' progress streams to the page; a viewer's is refused. The batches' list is filtered and
paged on the server, and a running batch's counts stream to its page until it ends.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from opod.control.console.kit import FRAGMENT_HEADER
from opod.store.client_jobs import JobLine
from tests.support.console import ConsoleSite, console_as
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, sim_worker, wait_until

MODEL = "pair"
A10G = "gpus:\n  - {name: NVIDIA A10G, class: A10G, memory_gb: 24, compute_capability: '8.6', count: 1}\n"
EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    root: Path = tmp_path_factory.mktemp("long-work")
    (root / "inventory.yaml").write_text(A10G)
    up = InProcessLeader(root / "leader", worker="sim", env={"OPOD_INVENTORY": str(root / "inventory.yaml")})
    worker: OpodProcess | None = None
    try:
        (root / "n2").mkdir()
        worker = sim_worker(up, root / "n2", "n2", OPOD_INVENTORY=str(root / "inventory.yaml"))
        wait_until(lambda: len(up.admin("GET", "/api/v1/nodes")[1]) == 2, 60, "the second worker to join")
        body = {"name": MODEL, "profiles": [{"engine": "sim", "gpu_class": "A10G"}], "scaling": {"min": 1, "max": 1}}
        assert up.admin("POST", "/api/v1/models", body)[0] == 200
        wait_until(lambda: states(up) == ["ready"], 60, "one ready replica")
        yield up
    finally:
        if worker is not None:
            worker.stop()
        up.stop()


operator = console_as("operator")


viewer = console_as("viewer")


def replicas(leader: InProcessLeader) -> list[dict[str, object]]:
    status, body = leader.admin("GET", f"/api/v1/replicas?model={MODEL}")
    assert status == 200, body
    return list(body)


def states(leader: InProcessLeader) -> list[object]:
    return [r["state"] for r in replicas(leader)]


def read_events(stream: Iterator[str], until: str, within: float) -> list[str]:
    """The events' data read from an open stream, up to the first that holds ``until``."""
    seen: list[str] = []
    current: list[str] = []
    ends = time.monotonic() + within
    for line in stream:
        if line.startswith("data: "):
            current.append(line[6:])
        elif not line and current:
            seen.append("\n".join(current))
            current = []
            if until in seen[-1]:
                return seen
        assert time.monotonic() < ends, f"no event held {until!r} within {within}s: {seen[-1:]}"
    raise AssertionError(f"the stream ended before an event held {until!r}: {seen[-1:]}")


# --- a rolling restart ---------------------------------------------------------------------------


def test_a_restart_from_a_models_page_is_the_api_call_audited_and_its_progress_streams(
    operator: ConsoleSite, leader: InProcessLeader
) -> None:
    old = str(replicas(leader)[0]["id"])
    page = operator.get(f"/console/models/{MODEL}")
    assert page.status_code == 200 and f'action="/console/models/{MODEL}/restart"' in page.text
    base = operator.serve()
    with (
        httpx.Client(base_url=base, timeout=30) as client,
        client.stream("GET", f"/console/models/{MODEL}/replicas") as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        assert old in read_events(lines, old, 10)[-1]
        answer = operator.post(f"/console/models/{MODEL}/restart", {})
        assert answer.status_code == 200, answer.text
        assert old in answer.json()["message"]
        during = operator.get(f"/console/models/{MODEL}", headers={FRAGMENT_HEADER: "replica_rows"}).text
        assert "being replaced" in during or "restart queued" in during, during
        done = read_events(lines, f"done: took over from {old}", 30)[-1]
    assert f'<th scope="row">{old}</th>' not in done  # the old replica stopped once its replacement was ready
    assert old not in [r["id"] for r in replicas(leader)] and states(leader) == ["ready"]
    row = next(r for r in operator.audit(MODEL) if r["action"] == "POST /api/v1/restart")
    assert (row["source"], row["actor"], row["target"], row["status"]) == (
        "web",
        "operator@example.com",
        "model:pair",
        202,
    )
    assert '"models"' in str(row["detail"]) and MODEL in str(row["detail"])


def test_a_viewer_may_not_restart_and_nothing_restarts(viewer: ConsoleSite, leader: InProcessLeader) -> None:
    page = viewer.get(f"/console/models/{MODEL}")
    assert page.status_code == 200 and "/restart" not in page.text  # no button for what they may not do
    before = replicas(leader)
    refused = viewer.post(f"/console/models/{MODEL}/restart", {})
    assert refused.status_code == 403 and "operate" in refused.json()["error"]
    assert [r.get("restart") for r in replicas(leader)] == [None] and replicas(leader)[0]["id"] == before[0]["id"]
    row = next(r for r in viewer.audit(MODEL) if r["action"] == "POST /api/v1/restart")
    assert (row["actor"], row["source"], row["status"]) == ("viewer@example.com", "web", 403)
    unknown = viewer.post("/console/models/nope/restart", {})
    assert unknown.status_code == 403  # the right is checked before anything else is looked at


# --- batches -------------------------------------------------------------------------------------


def keep_batch(leader: InProcessLeader, project: str, lines: int, *, model: str = MODEL) -> str:
    """A batch of ``lines`` lines, held by another leader's runner (this one leaves it alone), as a client's would be."""
    store = leader.leader.store
    job = store.create_client_job(
        owner_key_id="",
        project_id=project,
        endpoint="/v1/chat/completions",
        model=model,
        input_file_id="file-kept",
        completion_window=timedelta(hours=24),
        window_text="24h",
        metadata_json="{}",
        lines=[JobLine(i, f"req-{i}", '{"model": "pair", "messages": []}') for i in range(lines)],
        leased_to=("another-leader", timedelta(hours=1)),
    )
    return job.id


def test_batches_are_listed_filtered_by_state_and_project_and_paged(
    operator: ConsoleSite, leader: InProcessLeader
) -> None:
    ours = keep_batch(leader, "proj-a", 3, model=EVIL)
    theirs = keep_batch(leader, "proj-b", 2)
    page = operator.get("/console/batches?size=1")
    assert page.status_code == 200 and 'href="/console/batches"' in page.text  # the navigation's entry
    assert re.search(r"\d+ batches · page 1 of \d+", page.text) and 'rel="next"' in page.text
    only_a = operator.get("/console/batches?project=proj-a", headers={FRAGMENT_HEADER: "rows"}).text
    assert ours in only_a and theirs not in only_a and "<html" not in only_a
    assert EVIL not in only_a and "&lt;script&gt;" in only_a
    running = operator.get("/console/batches?state=in_progress").text
    assert ours in running and theirs in running
    assert ours not in operator.get("/console/batches?state=completed").text
    wrong = operator.get("/console/batches?state=sleeping")
    assert wrong.status_code == 400 and "state: &#39;sleeping&#39; is not one of" in wrong.text
    assert operator.get("/console/batches/batch_nope").status_code == 404


def test_a_running_batch_shows_its_counts_and_streams_them_until_it_ends(
    viewer: ConsoleSite, leader: InProcessLeader
) -> None:
    batch = keep_batch(leader, "proj-s", 4)
    store = leader.leader.store
    store.answer_line(batch, 0, ok=True, response_json='{"status_code": 200}')
    page = viewer.get(f"/console/batches/{batch}").text
    assert f'data-stream="/console/batches/{batch}/live"' in page and 'data-stream-event="batch"' in page
    assert '<dd id="batch-total">4</dd>' in page and '<dd id="batch-completed">1</dd>' in page
    assert '<dd id="batch-pending">3</dd>' in page

    async def follow() -> httpx.Response:
        stream = asyncio.create_task(viewer.client.get(f"/console/batches/{batch}/live"))
        await asyncio.sleep(0.8)
        store.answer_line(batch, 1, ok=True, response_json='{"status_code": 200}')
        store.answer_line(batch, 2, ok=False, response_json=None, error_json='{"message": "no"}')
        await asyncio.sleep(0.8)
        store.answer_line(batch, 3, ok=True, response_json='{"status_code": 200}')
        store.finish_client_job(batch, "completed", output=b"{}\n", errors=b"{}\n")
        return await asyncio.wait_for(stream, 10)

    answer = leader.call(follow())
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = answer.text
    assert events.count("event: batch") >= 3 and events.rstrip().endswith("event: end\ndata:")
    assert '<dd id="batch-completed">2</dd>' in events and '<dd id="batch-failed">1</dd>' in events
    assert '<dd id="batch-completed">3</dd>' in events and "state-completed" in events
    ended = viewer.get(f"/console/batches/{batch}").text
    assert "data-stream=" not in ended and 'aria-valuenow="4"' in ended


def test_a_batch_cancelled_from_its_page_is_the_api_call_audited_and_an_ended_one_is_refused(
    operator: ConsoleSite, viewer: ConsoleSite, leader: InProcessLeader
) -> None:
    batch = keep_batch(leader, "proj-c", 2)
    assert f'action="/console/batches/{batch}/cancel"' in operator.get(f"/console/batches/{batch}").text
    assert "/cancel" not in viewer.get(f"/console/batches/{batch}").text
    refused = viewer.post(f"/console/batches/{batch}/cancel", {})
    assert refused.status_code == 403
    job = leader.leader.store.get_client_job(batch)
    assert job is not None and job.status == "in_progress"
    answer = operator.post(f"/console/batches/{batch}/cancel", {})
    assert answer.status_code == 200, answer.text
    job = leader.leader.store.get_client_job(batch)
    assert job is not None and job.status == "cancelling"
    assert "state-cancelling" in operator.get(f"/console/batches/{batch}").text
    rows = [r for r in operator.audit(batch) if r["action"] == "POST /api/v1/client-jobs/{id}/cancel"]
    assert [(r["actor"], r["source"], r["status"]) for r in rows[:2]] == [
        ("operator@example.com", "web", 200),
        ("viewer@example.com", "web", 403),
    ]
    leader.leader.store.finish_client_job(batch, "cancelled", output=None, errors=None)
    ended = operator.post(f"/console/batches/{batch}/cancel", {})
    assert ended.status_code == 409 and "has ended (cancelled)" in ended.json()["error"]
