"""``/api/v1/usage`` and ``/api/v1/usage/export`` on a real leader with a simulator worker.

A project's key is used through the ``openai`` package; its requests show under its project, its
team and its org in ``usage`` and in the CSV and JSON exports, the rows adding up to the requests
made, priced by the settings, with a budget shown only on the level that sets it.
"""

from __future__ import annotations

import csv
import io
import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
PROJECT_REQUESTS, ADMIN_REQUESTS = 5, 2
IN_PRICE, OUT_PRICE = 1000, 3000  # currency units per million tokens = micros per token
TEAM_BUDGET = 10**12


class Tree:
    def __init__(self, leader: Leader, org: str, team: str, project: str) -> None:
        self.leader, self.org, self.team, self.project = leader, org, team, project


def made(leader: Leader, path: str, body: dict) -> str:
    status, answer = leader.admin("POST", path, body)
    assert status == 201, (path, answer)
    assert isinstance(answer, dict)
    return answer["id"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("usage")
    leader = Leader(root / "leader")
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(
            leader, root / "worker", "n_usage", OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 0.0, "output_max": 6})
        )
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        org = made(leader, "/api/v1/orgs", {"name": "acme"})
        team = made(leader, "/api/v1/teams", {"name": "ml", "in": "acme"})
        project = made(leader, "/api/v1/projects", {"name": "chat", "in": "acme/ml"})
        body = (
            f"prices:\n  {MODEL}: {{input_per_million: {IN_PRICE}, output_per_million: {OUT_PRICE}}}\n"
            f"budgets:\n  - scope: team:acme/ml\n    period: month\n    micros: {TEAM_BUDGET}\n"
        )
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": body})
        assert status == 200, answer
        status, key = leader.admin("POST", "/api/v1/keys", {"name": "chat app", "project": "acme/ml/chat"})
        assert status == 201 and isinstance(key, dict), key
        leader.wait_served(MODEL, timeout=60)
        for secret, n in ((key["secret"], PROJECT_REQUESTS), (leader.key, ADMIN_REQUESTS)):
            client = openai.OpenAI(base_url=leader.url + "/v1", api_key=secret, max_retries=0, timeout=30)
            for i in range(n):
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=6
                )
        yield Tree(leader, org, team, project)
    finally:
        if worker is not None:
            worker.stop()
        leader.stop()


def usage(tree: Tree, query: str) -> list[dict]:
    status, body = tree.leader.admin("GET", "/api/v1/usage" + query)
    assert status == 200 and isinstance(body, list), body
    return body


def export(tree: Tree, query: str) -> tuple[int, str, str]:
    request = urllib.request.Request(
        tree.leader.admin_url + "/api/v1/usage/export" + query, headers={"Authorization": f"Bearer {tree.leader.key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("content-type", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("content-type", ""), error.read().decode()


def test_a_project_keys_requests_show_under_its_project_team_and_org(tree: Tree) -> None:
    # The ledger commits in batches: wait until every row is in.
    [project] = wait_until(
        lambda: [r for r in usage(tree, "?by=project") if r["requests"] == PROJECT_REQUESTS],
        15,
        "the project's requests in /usage",
    )
    assert (project["scope"], project["id"], project["name"], project["keys"]) == (
        f"project:{tree.project}",
        tree.project,
        "acme / ml / chat",
        1,
    )
    assert (
        project["errors"] == 0
        and project["prompt_tokens"] > 0
        and 0 < project["completion_tokens"] <= 6 * PROJECT_REQUESTS
    )
    assert project["cost_micros"] == project["prompt_tokens"] * IN_PRICE + project["completion_tokens"] * OUT_PRICE
    assert datetime.fromisoformat(project["last_at"].replace("Z", "+00:00")) > datetime.now(UTC) - timedelta(minutes=5)
    assert not {"budget_micros", "budget_period", "fraction"} & project.keys()  # the project sets no budget of its own

    [team] = usage(tree, "")  # by team when absent
    assert (team["scope"], team["name"], team["requests"], team["cost_micros"]) == (
        f"team:{tree.team}",
        "acme / ml",
        PROJECT_REQUESTS,
        project["cost_micros"],
    )
    assert (team["budget_micros"], team["budget_period"]) == (TEAM_BUDGET, "month")
    assert team["fraction"] == pytest.approx(project["cost_micros"] / TEAM_BUDGET)
    [org] = usage(tree, "?by=org&since=1h")
    assert (org["id"], org["name"], org["requests"]) == (
        tree.org,
        "acme",
        PROJECT_REQUESTS,
    ) and "budget_micros" not in org


def test_the_csv_and_json_exports_add_up_to_the_requests_made(tree: Tree) -> None:
    def every_row() -> list[dict] | None:
        # The ledger commits in batches: wait until every request's row is in.
        status, kind, text = export(tree, "?by=org,team,project&period=hour")
        assert status == 200 and kind.startswith("text/csv"), text
        rows = list(csv.DictReader(io.StringIO(text)))
        return rows if sum(int(r["Requests"]) for r in rows) == PROJECT_REQUESTS + ADMIN_REQUESTS else None

    rows = wait_until(every_row, 15, "every request in the CSV export")
    assert list(rows[0]) == [
        "Period",
        "Org",
        "Team",
        "Project",
        "Requests",
        "Errors",
        "Limited",
        "Prompt",
        "Completion",
        "CostMicros",
    ]
    ours = [r for r in rows if r["Project"] == tree.project]
    assert sum(int(r["Requests"]) for r in ours) == PROJECT_REQUESTS
    assert {(r["Org"], r["Team"]) for r in ours} == {(tree.org, tree.team)}
    assert sum(int(r["Requests"]) for r in rows if not r["Project"]) == ADMIN_REQUESTS  # the admin key's: no project
    assert all(r["Period"].endswith(":00:00Z") for r in rows)

    status, kind, text = export(tree, "?format=json&by=project,key,model&period=month")
    assert status == 200 and kind.startswith("application/json")
    found = json.loads(text)
    mine = [r for r in found if r["Project"] == tree.project]
    assert sum(r["Requests"] for r in mine) == PROJECT_REQUESTS and {r["Model"] for r in mine} == {MODEL}
    assert {r["Org"] for r in found} == {""}  # not asked for: empty
    assert set(found[0]) == {
        "Period",
        "Org",
        "Team",
        "Project",
        "User",
        "Key",
        "Model",
        "Requests",
        "Errors",
        "Limited",
        "Prompt",
        "Completion",
        "CostMicros",
        "Images",
        "Meshes",
    }
    [project] = usage(tree, "?by=project")
    assert sum(r["CostMicros"] for r in mine) == project["cost_micros"]
    assert found[0]["Period"].startswith(datetime.now(UTC).strftime("%Y-%m-01T00:00:00"))
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    status, _, text = export(tree, f"?format=json&from={day}&to={day}")  # one whole day, by day
    assert status == 200 and sum(r["Requests"] for r in json.loads(text)) == PROJECT_REQUESTS + ADMIN_REQUESTS


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("?by=region", "by: 'region' is not a dimension"),
        ("?period=week", "period: 'week' is not one of hour, day, month"),
        ("?from=yesterday", "from: 'yesterday' is neither a date"),
        ("?from=2026-09-02&to=2026-09-01", "is not after from"),
        ("?from=2026-09-01T10:00:00", "has no time zone"),
    ],
)
def test_a_bad_export_query_is_refused_naming_the_field(tree: Tree, query: str, words: str) -> None:
    status, _, text = export(tree, query)
    assert status == 400 and words in json.loads(text)["error"], text


def test_a_bad_usage_query_is_refused_naming_the_field(tree: Tree) -> None:
    for query, words in (("?by=user", "by: 'user' is not a level"), ("?since=yesterday", "since:")):
        status, _, body = http("GET", tree.leader.admin_url + "/api/v1/usage" + query, key=tree.leader.key)
        assert status == 400 and words in body["error"], body
