"""``/api/v1/requests/{id}``, its body and its replay, on one real leader with a simulator worker.

The settings keep bodies (each side capped at ``MAX_BYTES``) except for the project that says no.
Requests go through the ``openai`` package as a user's code makes them; each is then looked up by
the ``X-Request-Id`` its answer carried, as an operator would.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker

MODEL, OTHER = "sim-chat", "sim-other"
NODE = "n_requests"
MAX_BYTES = 2048


class Fleet:
    def __init__(self, leader: Leader, key: dict, private_key: dict, project: str) -> None:
        self.leader, self.key, self.private_key, self.project = leader, key, private_key, project

    def client(self, secret: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.leader.url + "/v1", api_key=secret or self.key["secret"], max_retries=0, timeout=30
        )

    def record(self, request_id: str) -> dict:
        return self.leader.request_record(request_id)

    def body(self, request_id: str) -> dict:
        return self.leader.request_body(request_id)

    def no_body(self, request_id: str) -> str:
        """Why the request's body is not kept (its 404's message)."""
        self.record(request_id)
        status, body = self.leader.admin("GET", f"/api/v1/requests/{request_id}/body")
        assert status == 404 and isinstance(body, dict), (status, body)
        return body["error"]


def made(leader: Leader, path: str, body: dict) -> str:
    status, answer = leader.admin("POST", path, body)
    assert status == 201 and isinstance(answer, dict), (path, answer)
    return answer["id"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("requests")
    leader = Leader(root / "leader")
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(
            leader, root / "worker", NODE, OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 0.0, "output_max": 8})
        )
        worker.wait_for_line("registered with", timeout=30)
        for model in (MODEL, OTHER):
            assert opod_cli(leader, "model", "add", model, "--engine", "sim").returncode == 0
        made(leader, "/api/v1/orgs", {"name": "acme"})
        made(leader, "/api/v1/teams", {"name": "ml", "in": "acme"})
        project = made(leader, "/api/v1/projects", {"name": "chat", "in": "acme/ml"})
        made(leader, "/api/v1/projects", {"name": "private", "in": "acme/ml"})
        body = (
            f"retention:\n  bodies: true\n  body_max_bytes: {MAX_BYTES}\n  projects:\n"
            "    'project:acme/ml/private': {bodies: false}\n"
        )
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": body})
        assert status == 200, answer
        status, key = leader.admin("POST", "/api/v1/keys", {"name": "chat app", "project": "acme/ml/chat"})
        assert status == 201 and isinstance(key, dict), key
        status, private = leader.admin("POST", "/api/v1/keys", {"name": "private app", "project": "acme/ml/private"})
        assert status == 201 and isinstance(private, dict), private
        leader.wait_served(MODEL, OTHER, timeout=60)
        yield Fleet(leader, key, private, project)
    finally:
        if worker is not None:
            worker.stop()
        leader.stop()


def ask(fleet: Fleet, content: str, secret: str | None = None, **extra: object) -> tuple[str, str]:
    """A chat request through the openai package: its X-Request-Id and the answer's text."""
    raw = fleet.client(secret).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8, **extra
    )  # type: ignore[call-overload]
    return raw.headers["x-request-id"], raw.parse().choices[0].message.content or ""


def test_a_request_is_found_by_its_request_id_with_who_what_and_how(fleet: Fleet) -> None:
    request_id, _ = ask(fleet, "hello there", user="alice@example.com", metadata={"feature": "search", "ab": "b"})
    record = fleet.record(request_id)
    assert record["request_id"] == request_id
    assert record["key_id"] == fleet.key["id"] and record["project_id"] == fleet.project
    assert (record["model"], record["served_model"], record["replica"], record["status"]) == (MODEL, MODEL, NODE, 200)
    assert record["end_user"] == "alice@example.com"
    assert record["tags"] == {"feature": "search", "ab": "b"}
    assert record["prompt_tokens"] > 0 and 0 < record["completion_tokens"] <= 8
    assert record["latency_ms"] >= record["ttft_ms"] >= 0 and record["queue_ms"] == 0
    assert record["cache_hit"] in (True, False) and "at" in record


def test_an_unknown_request_id_is_a_404_naming_it(fleet: Fleet) -> None:
    status, body = fleet.leader.admin("GET", "/api/v1/requests/no-such-request")
    assert status == 404 and "no-such-request" in body["error"]
    status, body = fleet.leader.admin("POST", "/api/v1/requests/no-such-request/replay", {})
    assert status == 404 and "no-such-request" in body["error"]


def test_the_body_and_the_answer_are_kept(fleet: Fleet) -> None:
    request_id, answer = ask(fleet, "keep this question")
    body = fleet.body(request_id)
    assert "keep this question" in json.loads(body["request"])["messages"][0]["content"]
    assert body["response"] and answer in body["response"]
    assert json.loads(body["response"])["choices"][0]["message"]["content"] == answer
    assert (body["path"], body["model"], body["status"], body["truncated"]) == (
        "/v1/chat/completions",
        MODEL,
        200,
        False,
    )
    assert body["project_id"] == fleet.project and body["expires_at"] > body["at"]


def test_a_streamed_answer_is_kept_as_its_text(fleet: Fleet) -> None:
    raw = fleet.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "stream it"}], max_tokens=8, stream=True
    )
    request_id = raw.headers["x-request-id"]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert text
    body = fleet.body(request_id)
    assert body["response"] == text  # the answer as read, not the SSE lines
    assert json.loads(body["request"])["stream"] is True


def test_store_false_keeps_no_body_and_says_why(fleet: Fleet) -> None:
    request_id, _ = ask(fleet, "do not keep this", store=False)
    assert "store" in fleet.no_body(request_id)


def test_a_project_that_says_no_keeps_no_body(fleet: Fleet) -> None:
    request_id, _ = ask(fleet, "private matter", secret=fleet.private_key["secret"])
    assert fleet.record(request_id)["key_id"] == fleet.private_key["id"]
    assert "project" in fleet.no_body(request_id)


def test_an_over_long_body_is_cut_and_marked_truncated(fleet: Fleet) -> None:
    request_id, _ = ask(fleet, "x" * (3 * MAX_BYTES))
    body = fleet.body(request_id)
    assert body["truncated"] is True
    assert len(body["request"].encode()) == MAX_BYTES and body["request"].startswith("{")
    status, answer = fleet.leader.admin("POST", f"/api/v1/requests/{request_id}/replay", {})
    assert status == 409 and "truncated" in answer["error"]


def test_replay_to_another_model_answers(fleet: Fleet) -> None:
    request_id, _ = ask(fleet, "say it again")
    fleet.body(request_id)
    status, replay = fleet.leader.admin("POST", f"/api/v1/requests/{request_id}/replay", {"model": OTHER})
    assert status == 200, replay
    assert (replay["model"], replay["status"]) == (OTHER, 200)
    assert replay["body"]["model"] == OTHER and replay["body"]["choices"][0]["message"]["content"]
    assert replay["original"]["request_id"] == request_id and replay["took_ms"] >= 0
    status, again = fleet.leader.admin("POST", f"/api/v1/requests/{request_id}/replay", {})
    assert status == 200 and again["model"] == MODEL and again["status"] == 200


def test_a_replay_is_the_operators_request_never_charged_to_the_project(fleet: Fleet) -> None:
    status, key = fleet.leader.admin("POST", "/api/v1/keys", {"name": "short-lived", "project": "acme/ml/chat"})
    assert status == 201 and isinstance(key, dict), key
    request_id, _ = ask(fleet, "before the revocation", secret=key["secret"])
    fleet.body(request_id)
    status, _ = fleet.leader.admin("DELETE", f"/api/v1/keys/{key['id']}")
    assert status in (200, 204)

    def project_requests() -> int:
        status, rows = fleet.leader.admin("GET", "/api/v1/usage?by=project&since=1h")
        assert status == 200 and isinstance(rows, list), rows
        return sum(r.get("requests", 0) for r in rows if r.get("name", "").endswith("chat"))

    before = project_requests()
    status, replay = fleet.leader.admin("POST", f"/api/v1/requests/{request_id}/replay", {})
    assert status == 200 and replay["status"] == 200, replay  # a revoked key does not stop the operator
    time.sleep(1.5)  # the replay's usage row is committed within the ledger's group-commit interval
    assert project_requests() == before
