"""The console's model lifecycle pages in Debian's Chromium: a serve job's progress streamed into its page until it
ends, a canary's figures, and an eval run started from its form and followed live to its cases.

Screenshots go to the test's output folder, or ``OPOD_CONSOLE_SCREENSHOTS`` (the README's come from
``docs/screenshots/``). Skipped with a message where Chromium or Playwright is missing; ``.ci/run`` installs both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from opod.contract.admin.models import ModelserveJob, ModelserveRequest, ModelserveStep
from opod.store.serve_jobs import new_serve_job_id
from tests.support.console import ConsoleSite
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import OpodProcess, sim_worker
from tests.support.site import FixedViewer, browser_fixture, needs_chromium, person, shots

STABLE, CANDIDATE, NODE = "chat", "chat-next", "n_browser"
SUITE = """\
description: what an echo passes, and one it fails
threshold: 0.5
cases:
  - id: number
    prompt: the answer is 42
    regex: '\\b42\\b'
  - id: greeting
    prompt: hello there
    contains: hello
  - id: sum
    prompt: what is 2+2? answer with the number alone
    exact: '4'
"""

needs_chromium()
browser = browser_fixture()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsoleSite, str]]:
    root = tmp_path_factory.mktemp("lifecycle-browser")
    evals = root / "evals"
    evals.mkdir()
    (evals / "echoes.yaml").write_text(SUITE)
    leader = InProcessLeader(root / "leader", env={"OPOD_EVAL_DIR": str(evals)})
    worker: OpodProcess | None = None
    console: ConsoleSite | None = None
    try:
        flags = {"mode": "echo", "output_min": 8, "output_max": 8, "time_scale": 0.05}
        worker = sim_worker(leader, root / "worker", NODE, OPOD_ENGINE_FLAGS=json.dumps(flags))
        worker.wait_for_line("registered with", timeout=30)
        for model in (STABLE, CANDIDATE):
            body = {"name": model, "profiles": [{"engine": "sim"}], "scaling": {"min": 0}}
            assert leader.admin("POST", "/api/v1/models", body)[0] == 200
            assert leader.admin("POST", f"/api/v1/models/{model}/load", {"node": NODE})[0] == 200
        leader.wait_served(STABLE, CANDIDATE, timeout=60)
        status, job = leader.admin("POST", f"/api/v1/models/{STABLE}/canary", {"model": CANDIDATE, "percent": 25})
        assert status == 202, job
        console = ConsoleSite(leader, FixedViewer(person("operator")))
        yield console, console.serve()
    finally:
        if console is not None:
            console.close()
        if worker is not None:
            worker.stop()
        leader.stop()


def kept_job(console: ConsoleSite, state: str, model: str, **extra: object) -> ModelserveJob:
    """A serve job in the store, as a leader running it keeps it."""
    at = datetime.now(UTC) - timedelta(seconds=30)
    names = ("resolve", "fetch", "place", "start", "smoke test", "eval")
    steps = [ModelserveStep(name=n, state="done" if state == "succeeded" else "waiting", at=at) for n in names]
    steps[0] = ModelserveStep(name="resolve", state="done", detail="acme/tiny-GGUF@3f2a: tiny-Q4_K_M.gguf", at=at)
    job = ModelserveJob(
        id=new_serve_job_id(),
        request=ModelserveRequest(repo="acme/tiny-GGUF", quant="Q4_K_M"),
        state=state,
        model=model,
        steps=steps,
        started=at,
        **extra,  # type: ignore[arg-type]
    )
    body = job.model_dump_json(exclude_none=True, by_alias=True)
    console.leader.leader.store.add_serve_job(job.id or "", body, runner="another-leader", at=at)
    return job


def put(console: ConsoleSite, job: ModelserveJob) -> None:
    body = job.model_dump_json(exclude_none=True, by_alias=True)
    console.leader.leader.store.put_serve_job(job.id or "", job.state or "running", body)


def test_a_serve_job_streams_into_its_page_and_the_jobs_list_shows_it(
    site: tuple[ConsoleSite, str], browser, tmp_path: Path
) -> None:
    console, url = site
    folder = shots(tmp_path)
    done = kept_job(console, "succeeded", "tiny", reply="Hello! Nice to meet you.", tokens_per_second=38.2)
    put(console, done)
    job = kept_job(console, "running", "tiny-q8")
    assert job.steps is not None
    job.steps[1] = ModelserveStep(name="fetch", state="running", detail="tiny-Q4_K_M.gguf: starting")
    put(console, job)
    page = browser.new_page(viewport={"width": 1280, "height": 820}, color_scheme="light")
    page.goto(f"{url}/console/jobs/{job.id}")
    page.wait_for_selector("#job-live[data-updated]", timeout=5000)
    job.steps[1].detail = "tiny-Q4_K_M.gguf: 385 kB of 771 kB (50%), 2.1 MB/s"
    put(console, job)
    page.wait_for_function("document.getElementById('job-live').textContent.includes('385 kB of 771 kB (50%)')")
    page.screenshot(path=str(folder / "console-job-running.png"))
    job.steps[1] = ModelserveStep(name="fetch", state="done", detail="tiny-Q4_K_M.gguf: 100% of 771 kB")
    job.state, job.error = "failed", "place: no node has 1 GB free for tiny-q8; free one, or serve a smaller file"
    put(console, job)
    page.wait_for_selector("#job-live[data-ended]", timeout=5000)
    assert "no node has 1 GB free" in page.get_by_role("alert").inner_text()
    page.goto(f"{url}/console/jobs")
    for shown in (done, job):
        assert page.locator(f"#rows tbody tr:has-text('{shown.id}')").count() == 1
    page.get_by_role("link", name=done.id or "").click()
    page.wait_for_selector("text=Hello! Nice to meet you.")
    assert "38.2" in page.locator("main").inner_text()
    page.screenshot(path=str(folder / "console-job.png"))
    page.goto(f"{url}/console/jobs")
    page.screenshot(path=str(folder / "console-jobs.png"))
    page.close()


def test_canary_figures_and_an_eval_run_followed_live_in_chromium(
    site: tuple[ConsoleSite, str], browser, tmp_path: Path
) -> None:
    console, url = site
    folder = shots(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 820}, color_scheme="dark")
    page.goto(f"{url}/console/canaries")
    assert page.get_by_role("heading", name=f"{STABLE} → {CANDIDATE}").is_visible()
    page.get_by_label(f"Share of {STABLE}'s requests for {CANDIDATE}, in percent").fill("40")
    page.get_by_role("button", name=f"Set the share of {STABLE}'s canary").click()
    page.wait_for_function("document.getElementById('status').textContent.includes('40%')")
    page.wait_for_function("document.getElementById('figures').textContent.includes('takes 40% of the requests')")
    row = console.audit(STABLE)[0]
    assert (row["action"], row["source"], row["actor"]) == (
        "PUT /api/v1/models/{name}/canary",
        "web",
        "operator@example.com",
    )
    page.screenshot(path=str(folder / "console-canaries.png"))
    page.goto(f"{url}/console/evals")
    form = page.get_by_role("form", name="Run a suite on a model")
    form.locator("select[name=model]").select_option(CANDIDATE)
    form.locator("select[name=suite]").select_option("echoes")
    form.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_url("**/console/evals/*", timeout=5000)
    page.wait_for_function("document.getElementById('run-state').textContent === 'done'", timeout=15000)
    cells = page.locator("#run-live tbody tr")
    assert cells.count() == 3 and "the answer is 42" in cells.first.inner_text()
    assert page.locator("#run-live").get_by_text("pass", exact=True).count() == 2
    page.screenshot(path=str(folder / "console-eval-run.png"), full_page=True)
    page.goto(f"{url}/console/evals?model={CANDIDATE}")
    assert page.locator("#rows tbody tr").count() == 1
    page.screenshot(path=str(folder / "console-evals.png"))
    page.close()
