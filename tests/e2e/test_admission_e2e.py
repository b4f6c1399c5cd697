"""Admission through a live leader: more requests than engine slots, keys of different classes and teams.

Critical requests keep their latency while sheddable ones are shed with 503 and
Retry-After; two teams in one class get equal shares whatever their offered load.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from opod.contract import adminapi
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, opod_cli, sim_worker, wait_until

MODEL = "sim-busy"


def _write(path: Path, snap: adminapi.WireModel) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(snap.to_json())
    os.replace(tmp, path)


def _key(name: str, klass: str, team: str) -> tuple[str, adminapi.SnapshotKey]:
    secret = f"sk-opod-{name}-{os.urandom(6).hex()}"
    return secret, adminapi.SnapshotKey(
        id=name, name=name, hash=hashlib.sha256(secret.encode()).hexdigest(), admission_class=klass, team=team
    )


def _chat(url: str, key: str) -> tuple[int, float, str]:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "work"}], "max_tokens": 6}).encode()
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status, time.perf_counter() - started, ""
    except urllib.error.HTTPError as error:
        error.read()
        return error.code, time.perf_counter() - started, error.headers.get("Retry-After", "")


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("admission")
    files = root / "files"
    files.mkdir()
    keys = dict(
        critical=_key("ops", "critical", "ops"),
        sheddable=_key("batch", "sheddable", "batch"),
        team_a=_key("alpha", "standard", "alpha"),
        team_b=_key("beta", "standard", "beta"),
    )
    _write(
        files / "auth.json", adminapi.AuthSnapshot(revision="1", require_keys=True, keys=[k for _, k in keys.values()])
    )
    _write(
        files / "policy.json",
        adminapi.PolicySnapshot(
            revision="p1",
            admission=adminapi.PolicyAdmission(
                hold_ms=20000,
                max_held=500,
                classes=[
                    adminapi.PolicyAdmissionClass(name="critical", hold_ms=20000),
                    adminapi.PolicyAdmissionClass(name="sheddable", hold_ms=0),
                ],
            ),
        ),
    )
    leader = Leader(
        root / "leader",
        env={"OPOD_AUTH_FILE": str(files / "auth.json"), "OPOD_POLICY_FILE": str(files / "policy.json")},
    )
    home = root / "worker"
    worker = sim_worker(leader, home, "n_busy", OPOD_ENGINE_FLAGS=json.dumps({"max_num_seqs": 2}))
    worker.wait_for_line("registered with", timeout=30)
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
    leader.wait_served(MODEL)
    wait_until(lambda: _slots(leader) == 2, 20, "the worker to report its 2 slots")
    yield leader, {name: secret for name, (secret, _) in keys.items()}
    worker.stop()
    leader.stop()


def _slots(leader: Leader) -> int:
    status, _, body = http("GET", leader.url + "/admin/v1/nodes", key=leader.key)
    return next((n["slots"] for n in body if n["id"] == "n_busy"), 0)


def _load(url: str, key: str, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        out.append(_chat(url, key))


def test_critical_keeps_its_latency_while_sheddable_is_shed(busy) -> None:
    leader, keys = busy
    quiet = sorted(_chat(leader.url, keys["critical"])[1] for _ in range(5))[2]
    stop = threading.Event()
    shed: list = []
    threads = [threading.Thread(target=_load, args=(leader.url, keys["sheddable"], stop, shed)) for _ in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    critical = [_chat(leader.url, keys["critical"]) for _ in range(15)]
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert all(status == 200 for status, _, _ in critical)
    busy_p50 = sorted(seconds for _, seconds, _ in critical)[len(critical) // 2]
    assert busy_p50 < quiet * 2 + 0.15, (
        f"critical p50 {busy_p50 * 1000:.0f} ms under load vs {quiet * 1000:.0f} ms quiet"
    )
    refused = [(status, retry) for status, _, retry in shed if status != 200]
    assert refused, "sheddable requests beyond the slots are shed"
    assert all(status == 503 and retry.isdigit() and int(retry) >= 1 for status, retry in refused)


def test_two_teams_in_one_class_get_equal_shares(busy) -> None:
    leader, keys = busy
    stop = threading.Event()
    done: dict[str, list] = {"alpha": [], "beta": []}
    threads = [threading.Thread(target=_load, args=(leader.url, keys["team_a"], stop, done["alpha"])) for _ in range(6)]
    threads += [threading.Thread(target=_load, args=(leader.url, keys["team_b"], stop, done["beta"])) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(12)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    served = Counter({team: sum(1 for status, _, _ in results if status == 200) for team, results in done.items()})
    total = served["alpha"] + served["beta"]
    assert total > 60, served
    share = served["beta"] / total
    assert abs(share - 0.5) <= 0.05, (
        f"shares {dict(served)}: beta has {share:.0%} of the slots with a quarter of the clients"
    )
