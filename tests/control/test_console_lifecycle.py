"""The console's model lifecycle pages on a leader in this process, with one simulator worker and a loopback Hub.

Serve jobs (the list, a job's steps with the fetch's bytes streamed while it runs, the smoke test's
reply, a failed job's error, a plan, serving), canaries (stable-vs-candidate figures, share, promote,
stop) and eval runs (the list by model, a run's cases, starting one): each page is the service's own
answer, each change is the management API's call audited ``source: web`` with the person as the actor,
and a viewer's change is refused and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.ports import free_port
from opod.contract.admin.models import ModelserveJob, ModelserveRequest, ModelserveStep
from opod.control.console.kit import FRAGMENT_HEADER
from opod.store.serve_jobs import new_serve_job_id
from tests.support.console import ConsoleSite, console_as
from tests.support.hubserver import HubServer
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, clean_env, sim_worker, wait_until
from tests.support.site import CSRF

TINY = "acme/tiny-GGUF"
STABLE, CANDIDATE = "chat", "chat-next"
NODE = "n_life"
EVIL = "<script>alert(1)</script>"
SUITE = """\
description: two cases the echo passes and one it fails
threshold: 0.5
cases:
  - id: number
    prompt: the answer is 42
    regex: '\\b42\\b'
  - id: hello
    prompt: hello there
    contains: hello
  - id: sum
    prompt: what is 2+2? answer with the number alone
    exact: '4'
"""


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    with HubServer().running_in_thread() as server:
        server.add_tiny_gguf(TINY, "tiny-Q4_K_M.gguf")
        server.add_file(TINY, "README.md", b"---\nlicense: apache-2.0\n---\n# tiny\n")
        yield server


@pytest.fixture(scope="module")
def leader(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    root: Path = tmp_path_factory.mktemp("lifecycle")
    evals = root / "evals"
    evals.mkdir()
    (evals / "echoes.yaml").write_text(SUITE)
    up = InProcessLeader(root / "leader", env={"HF_ENDPOINT": hub.url, "OPOD_EVAL_DIR": str(evals)})
    worker: OpodProcess | None = None
    try:
        flags = {"mode": "echo", "output_min": 8, "output_max": 8, "time_scale": 0.05}
        worker = sim_worker(up, root / "worker", NODE, OPOD_ENGINE_FLAGS=json.dumps(flags))
        worker.wait_for_line("registered with", timeout=30)
        for model in (STABLE, CANDIDATE):
            body = {"name": model, "profiles": [{"engine": "sim"}], "scaling": {"min": 0}}
            assert up.admin("POST", "/api/v1/models", body)[0] == 200
            assert up.admin("POST", f"/api/v1/models/{model}/load", {"node": NODE})[0] == 200
        up.wait_served(STABLE, CANDIDATE, timeout=60)
        status, made = up.admin("POST", "/api/v1/keys", {"name": "client"})
        assert status == 201, made
        up.client_key = made["secret"]  # type: ignore[attr-defined]
        yield up
    finally:
        if worker is not None:
            worker.stop()
        up.stop()


operator = console_as("operator")


viewer = console_as("viewer")


def by_web(site: ConsoleSite, contains: str, action: str) -> dict[str, Any]:
    """The newest audit row of ``action`` on ``contains``, checked to be the person's, from the web."""
    rows = [r for r in site.audit(contains) if r["action"] == action]
    assert rows, f"no audit row of {action} on {contains}"
    assert rows[0]["source"] == "web" and rows[0]["actor"] == site.auth.person.actor, rows[0]  # type: ignore[union-attr]
    return rows[0]


def chat(leader: InProcessLeader, count: int) -> None:
    for _ in range(count):
        body = {"model": STABLE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
        request = urllib.request.Request(
            leader.url + "/v1/chat/completions",
            json.dumps(body).encode(),
            {
                "Authorization": f"Bearer {leader.client_key}",  # type: ignore[attr-defined]
                "Content-Type": "application/json",
                "X-Request-Id": uuid.uuid4().hex,
            },
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()


def keep_job(leader: InProcessLeader, state: str, *, model: str, **extra: Any) -> str:
    """A serve job kept as another leader's would be (the page reads the store's, as ``GET /jobs`` does)."""
    job_id = new_serve_job_id()
    at = datetime.now(UTC) - timedelta(minutes=1)
    steps = [
        ModelserveStep(name="resolve", state="done", detail=f"{TINY}: tiny-Q4_K_M.gguf", at=at),
        ModelserveStep(name="fetch", state="done" if state != "running" else "running", detail="fetching", at=at),
    ]
    job = ModelserveJob(
        id=job_id,
        request=ModelserveRequest(repo=TINY, quant="Q4_K_M"),
        state=state,
        model=model,
        steps=steps,
        started=at,
        **extra,
    )
    body = job.model_dump_json(exclude_none=True, by_alias=True)
    leader.leader.store.add_serve_job(job_id, body, runner="another-leader", at=at)
    if state != "running":
        leader.leader.store.put_serve_job(job_id, state, body)
    return job_id


# --- serve jobs ----------------------------------------------------------------------------------------


def test_serve_jobs_are_listed_paged_and_filtered_and_a_job_shows_its_reply_or_its_error(
    operator: ConsoleSite, leader: InProcessLeader
) -> None:
    done = keep_job(leader, "succeeded", model="tiny-done", reply="Hello there, friend of mine", tokens_per_second=41.5)
    failed = keep_job(leader, "failed", model=f"tiny-{EVIL}", error="fetch: tiny-Q4_K_M.gguf failed its sha256 digest")
    page = operator.get("/console/jobs?size=1")
    assert page.status_code == 200, page.text
    assert re.search(r"\d+ of \d+ jobs · page 1 of \d+", page.text) and 'rel="next"' in page.text
    found = operator.get(f"/console/jobs?q={done}", headers={FRAGMENT_HEADER: "rows"})
    assert done in found.text and failed not in found.text and "<html" not in found.text
    only_failed = operator.get("/console/jobs?state=failed").text
    assert failed in only_failed and done not in only_failed
    assert EVIL not in only_failed and "&lt;script&gt;" in only_failed
    good = operator.get(f"/console/jobs/{done}").text
    assert "Hello there, friend of mine" in good and "41.5" in good and "data-stream" not in good
    bad = operator.get(f"/console/jobs/{failed}").text
    assert 'role="alert"' in bad and "failed its sha256 digest" in bad
    wrong = operator.get("/console/jobs?state=sleeping")
    assert wrong.status_code == 400 and "state:" in wrong.text
    assert operator.get("/console/jobs/sj_nope").status_code == 404


def test_a_running_job_streams_its_fetch_progress_until_it_ends(operator: ConsoleSite, leader: InProcessLeader) -> None:
    job_id = keep_job(leader, "running", model="tiny-streamed")
    page = operator.get(f"/console/jobs/{job_id}").text
    assert f'data-stream="/console/jobs/{job_id}/live"' in page and 'data-stream-event="job"' in page

    async def follow() -> str:
        stream = asyncio.create_task(operator.client.get(f"/console/jobs/{job_id}/live"))
        await asyncio.sleep(0.8)
        record = leader.leader.store.get_serve_job(job_id)
        assert record is not None
        job = ModelserveJob.model_validate_json(record.job_json)
        assert job.steps is not None
        job.steps[1].detail = "tiny-Q4_K_M.gguf: 300 kB of 600 kB (50%), 1.2 MB/s"
        leader.leader.store.put_serve_job(job_id, "running", job.model_dump_json(exclude_none=True, by_alias=True))
        await asyncio.sleep(0.8)
        job.steps[1].state, job.state, job.reply = "done", "succeeded", "Hi from the smoke test"
        leader.leader.store.put_serve_job(job_id, "succeeded", job.model_dump_json(exclude_none=True, by_alias=True))
        answer = await asyncio.wait_for(stream, 10)
        assert answer.headers["content-type"].startswith("text/event-stream")
        return answer.text

    events = leader.call(follow())
    assert events.count("event: job") >= 3 and events.rstrip().endswith("event: end\ndata:")
    assert "300 kB of 600 kB (50%)" in events and "Hi from the smoke test" in events
    assert 'role="progressbar" aria-label="Fetched" aria-valuemin="0" aria-valuemax="100" aria-valuenow="50"' in events
    assert events.index("300 kB of 600 kB") < events.index("Hi from the smoke test")


def test_a_plan_is_shown_and_serving_is_the_api_call_audited_from_the_web(
    operator: ConsoleSite, viewer: ConsoleSite, leader: InProcessLeader
) -> None:
    plan = operator.get(f"/console/plan?repo={TINY}")
    assert plan.status_code == 200, plan.text
    assert "tiny-Q4_K_M.gguf" in plan.text and "apache-2.0" in plan.text
    missing = operator.get("/console/plan?repo=acme/no-such-repo")
    assert missing.status_code == 404 and "acme/no-such-repo" in missing.text
    refused = operator.post("/console/jobs", {"repo": "acme/no-such-repo"})
    assert refused.status_code == 404 and "acme/no-such-repo" in refused.json()["error"]
    row = by_web(operator, "models/serve", "POST /api/v1/models/serve")
    assert row["status"] == 404 and "acme/no-such-repo" in row["detail"], row
    bad = operator.post("/console/jobs", {"repo": TINY, "replicas": "many"})
    assert bad.status_code == 400 and bad.json()["error"].startswith("replicas:")
    before = len(leader.call(leader.leader.control.serve_jobs.jobs()))
    no = viewer.post("/console/jobs", {"repo": TINY, "name": "tiny-by-viewer"})
    assert no.status_code == 403 and "operate" in no.json()["error"]
    assert len(leader.call(leader.leader.control.serve_jobs.jobs())) == before
    # The simulator's node runs no llama.cpp: the service's own refusal, said on the page's status line.
    unplaced = operator.post("/console/jobs", {"repo": TINY, "name": "tiny-web"})
    assert unplaced.status_code == 400 and "no node runs llamacpp" in unplaced.json()["error"]
    assert len(leader.call(leader.leader.control.serve_jobs.jobs())) == before


@pytest.mark.engine
def test_serving_from_the_web_streams_the_job_to_its_smoke_test_on_llama_cpp(
    operator: ConsoleSite, leader: InProcessLeader, hub: HubServer, tmp_path: Path
) -> None:
    from tests.support.llama_server import command

    command()  # skips, saying why, where no llama-server runs on this CPU
    home = tmp_path / "cpu-1"
    argv = ["join", leader.url, "--token", leader.node_token(), "--listen", f"127.0.0.1:{free_port()}"]
    worker = OpodProcess(argv, home, env=clean_env(home, OPOD_NODE_ID="cpu-1", HF_ENDPOINT=hub.url))
    try:
        wait_until(lambda: leader.leader.fleet.get("cpu-1"), 60, "the llama.cpp worker to join")
        started = operator.post("/console/jobs", {"repo": TINY, "name": "tiny-web", "replicas": "0"})
        assert started.status_code == 200, started.text
        job_id = started.json()["job"]
        assert started.json()["location"] == f"/console/jobs/{job_id}"
        row = by_web(operator, job_id, "POST /api/v1/models/serve")
        assert row["target"] == f"job:{job_id}" and row["status"] == 202, row
        events = operator.get(f"/console/jobs/{job_id}/live").text  # to the job's end
        assert events.rstrip().endswith("event: end\ndata:") and "100% of" in events
        page = operator.get(f"/console/jobs/{job_id}").text
        assert 'state-succeeded" id="job-state"' in page, page
        assert "Smoke test" in page and "Tokens a second" in page and "data-stream" not in page
    finally:
        worker.stop()


# --- canaries ------------------------------------------------------------------------------------------


def test_a_canary_is_started_shown_with_both_sides_figures_reshared_and_stopped_from_the_web(
    operator: ConsoleSite, viewer: ConsoleSite, leader: InProcessLeader
) -> None:
    started = operator.post("/console/canaries", {"model": STABLE, "candidate": CANDIDATE, "percent": "50"})
    assert started.status_code == 200, started.text
    row = by_web(operator, STABLE, "POST /api/v1/models/{name}/canary")
    assert row["target"] == f"model:{STABLE}" and row["status"] == 202, row
    chat(leader, 12)
    page = operator.get("/console/canaries").text
    assert f"{STABLE} → {CANDIDATE}" in page and "takes 50% of the requests" in page
    figures = operator.get("/console/canaries", headers={FRAGMENT_HEADER: "figures"}).text
    counts = [int(n) for n in re.findall(r"</small></th>\s*<td>(\d+)</td>", figures)]
    assert len(counts) == 2 and sum(counts) == 12 and all(counts), figures
    assert "Mean time to first token" in figures and " ms" in figures
    no = viewer.post(f"/console/canaries/{STABLE}/share", {"percent": "90"})
    assert no.status_code == 403
    reshared = operator.post(f"/console/canaries/{STABLE}/share", {"percent": "20"})
    assert reshared.status_code == 200 and "20%" in reshared.json()["message"]
    assert by_web(operator, STABLE, "PUT /api/v1/models/{name}/canary")["status"] == 200
    assert "takes 20% of the requests" in operator.get("/console/canaries").text
    stopped = operator.post(f"/console/canaries/{STABLE}/stop", {})
    assert stopped.status_code == 200, stopped.text
    assert by_web(operator, STABLE, "DELETE /api/v1/models/{name}/canary")["status"] == 200
    assert "No canary is running." in operator.get("/console/canaries").text
    again = operator.post(f"/console/canaries/{STABLE}/stop", {})
    assert again.status_code == 404 and "no canary" in again.json()["error"]


def test_a_canary_promoted_from_the_web_is_the_api_call_and_its_job_is_listed(
    operator: ConsoleSite, leader: InProcessLeader
) -> None:
    assert operator.post("/console/canaries", {"model": STABLE, "candidate": CANDIDATE, "percent": "0"}).is_success
    assert "In shadow" in operator.get("/console/canaries").text
    promoted = operator.post(f"/console/canaries/{STABLE}/promote", {"skip_eval": "on"})
    assert promoted.status_code == 200, promoted.text
    assert "succeeded" in promoted.json()["message"]
    row = by_web(operator, STABLE, "POST /api/v1/models/{name}/promote")
    assert row["status"] == 202
    page = operator.get("/console/canaries").text
    assert "No canary is running." in page and "promote" in page and "skip_eval" in page


# --- eval runs -----------------------------------------------------------------------------------------


def test_an_eval_run_started_from_the_web_shows_each_case_and_the_list_filters_by_model(
    operator: ConsoleSite, viewer: ConsoleSite, leader: InProcessLeader
) -> None:
    no = viewer.post("/console/evals", {"model": CANDIDATE, "suite": "echoes"})
    assert no.status_code == 403 and by_web(viewer, "/eval", "POST /api/v1/models/{name}/eval")["status"] == 403
    wrong = operator.post("/console/evals", {"model": CANDIDATE, "suite": "echoes", "min_score": "2"})
    assert wrong.status_code == 400 and wrong.json()["error"].startswith("min_score:")
    started = operator.post("/console/evals", {"model": CANDIDATE, "suite": "echoes", "concurrency": "1"})
    assert started.status_code == 200, started.text
    run_id = started.json()["run"]
    assert started.json()["location"] == f"/console/evals/{run_id}"
    assert by_web(operator, CANDIDATE, "POST /api/v1/models/{name}/eval")["status"] == 202
    live = operator.get(f"/console/evals/{run_id}/live").text  # to the run's end
    assert live.rstrip().endswith("event: end\ndata:") and "event: run" in live
    page = operator.get(f"/console/evals/{run_id}").text
    assert "data-stream" not in page and 'State: <span class="state state-done"' in page
    cases = re.findall(r'<th scope="row">(\w+)<br><small>(\w+)</small></th>', page)
    assert cases == [("number", "regex"), ("hello", "contains"), ("sum", "exact")]
    assert "the answer is 42" in page and "\\b42\\b" in page and page.count(">pass<") == 2 and ">fail<" in page
    mine = operator.get(f"/console/evals?model={CANDIDATE}", headers={FRAGMENT_HEADER: "rows"}).text
    assert run_id in mine
    other = operator.get(f"/console/evals?model={STABLE}", headers={FRAGMENT_HEADER: "rows"}).text
    assert run_id not in other
    listing = operator.get("/console/evals").text
    assert "echoes" in listing and "arithmetic" in listing and "Run a suite" in listing
    assert "Run a suite" not in viewer.get("/console/evals").text


def test_without_the_sessions_token_a_change_is_refused(operator: ConsoleSite) -> None:
    for path, body in (
        ("/console/jobs", {"repo": TINY}),
        ("/console/canaries", {"model": STABLE, "candidate": CANDIDATE}),
        ("/console/evals", {"model": STABLE, "suite": "echoes"}),
    ):
        refused = operator.post(path, body, csrf="not-" + CSRF)
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"], path
