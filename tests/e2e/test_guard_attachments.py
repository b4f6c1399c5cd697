"""A guard policy attached through ``/api/v1/guard/attachments`` on one real leader with a simulator worker that echoes
the user's message back: the policy checks the requests of what it is attached to from the next request on, and no
others; detached, it checks nothing; and ``/guard/events`` shows what it did.

Requests go through the ``openai`` package as a user's code makes them, with a key of the project.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
NODE = "n_guard_attachments"
SETTINGS = """\
guard:
  policies:
    - name: personal-data
      checks:
        - {reads: input, pii: email, action: redact}
"""


class Fleet:
    def __init__(self, leader: Leader, chat_key: str, other_key: str) -> None:
        self.leader, self.chat_key, self.other_key = leader, chat_key, other_key

    def ask(self, key: str, content: str) -> tuple[str, str]:
        """A chat request with ``key``: its request id and its answer's text (the simulator echoes the message)."""
        request_id = "ga-" + secrets.token_hex(6)
        client = openai.OpenAI(base_url=self.leader.url + "/v1", api_key=key, max_retries=0, timeout=30)
        answer = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
            max_tokens=64,
            extra_headers={"X-Request-Id": request_id},
        )
        return request_id, answer.choices[0].message.content or ""

    def change(self, method: str, body: dict) -> dict:
        status, answer = self.leader.admin(method, "/api/v1/guard/attachments", body)
        assert status == 200 and isinstance(answer, dict), (status, answer)
        return answer


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root: Path = tmp_path_factory.mktemp("guard-attachments")
    leader = Leader(root / "leader")
    worker: OpodProcess | None = None
    try:
        worker = sim_worker(
            leader, root / "worker", NODE, OPOD_ENGINE_FLAGS=json.dumps({"time_scale": 0.0, "mode": "echo"})
        )
        worker.wait_for_line("registered with", timeout=30)
        assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
        leader.wait_served(MODEL, timeout=60)
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": 0, "body": SETTINGS})
        assert status == 200, answer
        secrets_of: dict[str, str] = {}
        for path, body in (
            ("/api/v1/orgs", {"name": "acme"}),
            ("/api/v1/teams", {"name": "ml", "in": "acme"}),
            ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
            ("/api/v1/projects", {"name": "search", "in": "acme/ml"}),
            ("/api/v1/keys", {"name": "chat", "project": "acme/ml/chat"}),
            ("/api/v1/keys", {"name": "search", "project": "acme/ml/search"}),
        ):
            status, made = leader.admin("POST", path, body)
            assert status == 201, made
            if "secret" in made:
                secrets_of[made["name"]] = made["secret"]
        yield Fleet(leader, secrets_of["chat"], secrets_of["search"])
    finally:
        if worker is not None:
            worker.stop()
        leader.stop()


def test_a_policy_attached_to_a_project_checks_its_requests_and_no_others_until_detached(fleet: Fleet) -> None:
    mail = "mail ana.lopez@example.org please"
    _, before = fleet.ask(fleet.chat_key, mail)
    assert "ana.lopez@example.org" in before  # no policy applies yet: the engine got the address

    fleet.change("POST", {"target": "project:acme/ml/chat", "policy": "personal-data"})
    request_id, redacted = fleet.ask(fleet.chat_key, mail)
    assert "[redacted:email]" in redacted and "ana.lopez" not in redacted
    _, other = fleet.ask(fleet.other_key, mail)
    assert "ana.lopez@example.org" in other  # another project's key: not attached there

    def listed() -> list[dict] | None:
        status, found = fleet.leader.admin("GET", "/api/v1/guard/events")
        assert status == 200 and isinstance(found, dict), found
        return [e for e in found.get("events", []) if e["request_id"] == request_id] or None

    [event] = wait_until(listed, 15, f"request {request_id} among the guard events")
    assert (event["project"], event["action"], event["policy"], event["rule"], event["category"]) == (
        "acme/ml/chat",
        "rewrite",
        "personal-data",
        "email",
        "pii",
    )

    fleet.change("DELETE", {"target": "project:acme/ml/chat", "policy": "personal-data"})
    _, after = fleet.ask(fleet.chat_key, mail)
    assert "ana.lopez@example.org" in after
