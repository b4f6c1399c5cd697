"""``POST /api/v1/metrics/range`` against a real Prometheus scraping a real leader's ``/metrics`` every second.

Prometheus scrapes the leader as two jobs (``leader`` and ``leader-again``), so ``up`` has two series:
``by`` a label they share sums them into one line, and without ``by`` each is its own line.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from bench.ports import free_port
from tests.support import prometheus
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import remove_home, wait_until

NS = 1_000_000_000
MINUTE = {"window": 60 * NS, "step": NS}


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    home = tmp_path_factory.mktemp("metrics") / "leader"
    running = Leader(home, default_models=True)
    yield running
    running.stop()
    remove_home(home)


@pytest.fixture(scope="module")
def server(leader: Leader, tmp_path_factory: pytest.TempPathFactory) -> Iterator[prometheus.Prometheus]:
    if prometheus.binary() is None:
        pytest.skip(f"no Prometheus server to query: {prometheus.INSTALL}")
    target = f"127.0.0.1:{leader.port}"
    running = prometheus.Prometheus(
        tmp_path_factory.mktemp("prometheus"), {"leader": [target], "leader-again": [target]}
    )
    yield running
    running.stop()


def use_prometheus(leader: Leader, url: str) -> None:
    """Name ``url`` in the cluster's settings (empty: none), and wait until the leader has it in force."""
    status, current = leader.admin("GET", "/api/v1/settings")
    assert status == 200, current
    body = f"prometheus:\n  url: {url}\n" if url else ""
    status, answer = leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, answer
    wait_until(
        lambda: (
            metrics_range(leader, {**MINUTE, "queries": [{"id": "x", "expr": "up"}]})[1].get("configured") == bool(url)
        ),
        5,
        f"prometheus.url {url!r} in force",
    )


def metrics_range(leader: Leader, body: dict) -> tuple[int, dict]:
    status, answer = leader.admin("POST", "/api/v1/metrics/range", body)
    assert isinstance(answer, dict), answer
    return status, answer


def test_without_a_prometheus_the_answer_says_not_configured(leader: Leader) -> None:
    use_prometheus(leader, "")
    status, answer = metrics_range(leader, {**MINUTE, "queries": [{"id": "up", "expr": "up"}]})
    assert status == 200
    assert answer["configured"] is False and not answer.get("series") and not answer.get("errors")


def test_series_and_points_from_a_real_prometheus(leader: Leader, server: prometheus.Prometheus) -> None:
    use_prometheus(leader, server.url)
    wait_until(
        lambda: len(server.instant("up")) == 2, 30, f"Prometheus to scrape the leader twice; its log:\n{server.output}"
    )
    queries = [
        {"id": "up", "expr": "up", "by": "__name__"},
        {"id": "jobs", "expr": "up"},
        {"id": "workers", "expr": "opod_workers_live", "by": "job"},
        {"id": "broken", "expr": "rate((up[1m]"},
    ]
    asked = {**MINUTE, "queries": queries}

    def enough() -> dict | None:
        status, answer = metrics_range(leader, asked)
        assert status == 200, answer
        up = answer["series"].get("up") or [{}]
        return answer if len(up[0].get("Points", [])) >= 3 and up[0]["Points"][-1]["Value"] == 2 else None

    answer = wait_until(enough, 30, "three points of both scrapes")
    assert answer["configured"] is True
    (up,) = answer["series"]["up"]
    assert up["Name"] == "up"  # both jobs' series summed into one line
    points = up["Points"]
    times = [datetime.fromisoformat(p["At"].replace("Z", "+00:00")) for p in points]
    assert times == sorted(times) and all(b - a == timedelta(seconds=1) for a, b in zip(times, times[1:], strict=False))
    assert datetime.now(UTC) - times[-1] < timedelta(seconds=10)
    assert {p["Value"] for p in points} <= {1.0, 2.0}

    target = f"127.0.0.1:{leader.port}"
    assert {s["Name"] for s in answer["series"]["jobs"]} == {
        f'up{{instance="{target}",job="leader"}}',
        f'up{{instance="{target}",job="leader-again"}}',
    }
    workers = {s["Name"]: s["Points"] for s in answer["series"]["workers"]}
    assert set(workers) <= {"leader", "leader-again"} and workers
    assert all(p["Value"] == 0 for line in workers.values() for p in line)  # a leader without workers

    assert "broken" not in answer["series"]
    assert "parse error" in answer["errors"]["broken"]
    assert set(answer["errors"]) == {"broken"}


def test_an_unreachable_prometheus_is_named_in_each_query_s_error(leader: Leader) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    use_prometheus(leader, gone)
    status, answer = metrics_range(
        leader, {**MINUTE, "queries": [{"id": "a", "expr": "up"}, {"id": "b", "expr": "up"}]}
    )
    assert status == 200 and answer["configured"] is True
    assert set(answer["errors"]) == {"a", "b"} and all(
        f"cannot reach Prometheus at {gone}" in e for e in answer["errors"].values()
    )


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"step": NS, "queries": [{"id": "a", "expr": "up"}]}, "window:"),
        ({"window": 60 * NS, "step": 0, "queries": [{"id": "a", "expr": "up"}]}, "step:"),
        ({"window": 86400 * NS, "step": NS, "queries": [{"id": "a", "expr": "up"}]}, "window / step: 86400 points"),
        ({**MINUTE, "queries": []}, "queries:"),
        ({**MINUTE, "queries": [{"expr": "up"}]}, "queries[0].id"),
        (
            {**MINUTE, "queries": [{"id": "a", "expr": "up"}, {"id": "a", "expr": "up"}]},
            "queries[1].id: 'a' is used twice",
        ),
        ({**MINUTE, "queries": [{"id": "a", "expr": " "}]}, "queries[0].expr"),
        ({**MINUTE, "queries": [{"id": "a", "expr": "up", "label": "x"}]}, "queries.0.label"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(leader: Leader, body: dict, named: str) -> None:
    status, answer = metrics_range(leader, body)
    assert status == 400 and named in answer["error"], answer
