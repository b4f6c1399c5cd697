"""A leader killed with SIGKILL under load loses no usage row: complete answers keep theirs, in-flight ones are marked.

Each client request carries its own ``X-Request-Id``; after the restart the
usage stream is read to the end and compared with what the clients saw.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tests.support.opod_process import Leader, opod_cli, sim_worker, usage_rows, wait_until

MODEL = "sim-slow"


def _chat(leader: Leader, request_id: str) -> bool:
    """True when the whole answer arrived."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 12}).encode()
    request = urllib.request.Request(leader.url + "/v1/chat/completions", data=body, method="POST", headers={
        "Authorization": f"Bearer {leader.key}", "Content-Type": "application/json", "X-Request-Id": request_id})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
            return response.status == 200 and bool(answer["choices"][0]["message"]["content"])
    except (urllib.error.URLError, ConnectionError, OSError, ValueError):
        return False


def test_sigkill_under_load_keeps_every_answered_request_and_marks_the_rest(tmp_path: Path) -> None:
    home = tmp_path / "leader"
    leader = Leader(home, worker=False, extra=["--no-default-models"])
    worker_home = tmp_path / "worker"
    worker = sim_worker(leader, worker_home, "n_w", OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 1.0}))
    try:
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)

        answered: list[str] = []
        sent: list[str] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                request_id = f"crash-{uuid.uuid4().hex[:12]}"
                sent.append(request_id)
                if _chat(leader, request_id):
                    answered.append(request_id)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(answered) >= 40, 60, "answers to flow")
        leader.process.kill()
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert len(sent) > len(answered), "some requests must have been in flight at the kill"

        leader = Leader(home, worker=False, extra=["--no-default-models"])
        rows = usage_rows(leader)
        by_id = {r.data.request_id: r for r in rows if r.data.request_id.startswith("crash-")}
        missing = [rid for rid in answered if rid not in by_id or by_id[rid].data.outcome != "ok"]
        assert missing == [], f"{len(missing)} answered requests have no ok usage row: {missing[:5]}"
        interrupted = [r for r in by_id.values() if r.data.outcome == "interrupted"]
        assert interrupted, "requests in flight at the kill must appear as interrupted rows"
        assert all(rid in sent for rid in by_id), "no row for a request nobody sent"
        assert len({r.id for r in rows}) == len(rows), "no row twice"
        ok_rows = [r for r in by_id.values() if r.data.outcome == "ok"]
        assert all(r.data.completion_tokens > 0 and r.data.node_id == "n_w" and r.data.model == MODEL for r in ok_rows)
    finally:
        worker.stop()
        if leader.process.proc.poll() is None:
            leader.process.stop()
