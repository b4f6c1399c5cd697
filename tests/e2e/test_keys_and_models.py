"""Keys and models as an operator manages them with the opod command, and what survives a restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from opod.weights.tiny import write_tiny_llama
from tests.support.hubserver import HubServer
from tests.support.inprocess import InProcessLeader
from tests.support.opod_process import Leader, http, opod_cli, wait_until


def _models(leader: Leader | InProcessLeader, key: str) -> tuple[int, object]:
    status, _, body = http("GET", leader.url + "/v1/models", key=key)
    return status, body


def test_a_keys_last_use_is_recorded_after_a_v1_request(tmp_path: Path) -> None:
    leader = InProcessLeader(tmp_path / "home")
    try:
        created = json.loads(opod_cli(leader, "token", "create", "--name", "app", "--json").stdout)
        assert "last_used_at" not in created, "a key nobody used has no last use"
        assert _models(leader, created["secret"])[0] == 200

        def last_used() -> str | None:
            status, rows = leader.admin("GET", "/api/v1/keys")
            assert status == 200 and isinstance(rows, list)
            return next(r for r in rows if r["id"] == created["id"]).get("last_used_at")

        stamp = wait_until(last_used, 20, "the key's last use to show in the listing")
        assert stamp >= created["created_at"]
    finally:
        leader.stop()


def test_api_keys_are_created_listed_expired_and_revoked_at_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    leader = Leader(home, worker=False, extra=["--no-default-models"])
    try:
        created = opod_cli(leader, "token", "create", "--name", "ci")
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip()
        assert key.startswith("sk-opod-") and "shown once" in created.stderr
        assert _models(leader, key)[0] == 200
        assert _models(leader, "")[0] == 401
        listing = opod_cli(leader, "token", "ls")
        key_id = created.stderr.split("created API key ")[1].split()[0].rstrip(".,")
        assert key_id in listing.stdout and "active" in listing.stdout and key not in listing.stdout

        short = opod_cli(leader, "token", "create", "--ttl", "1s").stdout.strip()
        assert _models(leader, short)[0] == 200
        time.sleep(1.2)
        status, body = _models(leader, short)
        assert status == 401 and "expired" in body["error"]["message"]

        bad = opod_cli(leader, "token", "create", "--ttl", "soon")
        assert bad.returncode == 1 and "expires_in: 'soon' is not a lifetime" in bad.stderr

        revoked = opod_cli(leader, "token", "revoke", key_id)
        assert revoked.returncode == 0, revoked.stderr
        status, body = _models(leader, key)
        assert status == 401 and "revoked" in body["error"]["message"]

        node = opod_cli(leader, "token", "create", "--node")
        assert node.stdout.strip().startswith("sk-node-")
        assert "opod join" in node.stderr
        assert opod_cli(leader, "token", "ls", "--node").stdout.count("active") == 1

        assert leader.process.stop() == 0
        leader = Leader(home, worker=False, extra=["--no-default-models"])
        assert _models(leader, key)[0] == 401
        assert _models(leader, leader.key)[0] == 200
        assert sum("admin key" in line for line in leader.process.lines) == 0, (
            "the admin key is printed on first start only"
        )
    finally:
        leader.process.stop()


@pytest.mark.engine
def test_models_added_by_path_and_by_hub_repo_are_served_and_restored_after_a_restart(tmp_path: Path) -> None:
    gguf = write_tiny_llama(tmp_path / "my-tiny.gguf")
    with HubServer().running_in_thread() as hub:
        hub.add_tiny_gguf("acme/tiny-chat", seed=1)
        home = tmp_path / "home"
        env = {"HF_ENDPOINT": hub.url}
        leader = Leader(home, extra=["--no-default-models"], env=env)
        try:
            by_path = opod_cli(leader, "model", "add", "--gguf", str(gguf), "--name", "tiny")
            assert by_path.returncode == 0, by_path.stderr
            by_repo = opod_cli(leader, "model", "add", "hf:acme/tiny-chat")
            assert by_repo.returncode == 0, by_repo.stderr
            leader.wait_served("tiny", "tiny-chat", timeout=60)
            for model in ("tiny", "tiny-chat"):
                status, _, body = http(
                    "POST",
                    leader.url + "/v1/chat/completions",
                    {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6},
                    key=leader.key,
                )
                assert status == 200 and body["choices"][0]["message"]["content"], body
            listing = opod_cli(leader, "model", "ls")
            assert "tiny-chat" in listing.stdout and "serving on" in listing.stdout
            downloads = len(hub.requests_for("tiny-Q4_K_M.gguf", "GET"))
            assert downloads >= 1

            unloaded = opod_cli(leader, "model", "unload", "tiny")
            assert unloaded.returncode == 0, unloaded.stderr
            wait_until(lambda: "tiny" not in leader.served(), 30, "tiny to be unloaded")

            assert leader.process.stop() == 0
            leader = Leader(home, extra=["--no-default-models"], env=env)
            leader.wait_served("tiny-chat", timeout=60)
            time.sleep(3)
            assert "tiny" not in leader.served(), "an unloaded model stays unloaded across a restart"
            assert len(hub.requests_for("tiny-Q4_K_M.gguf", "GET")) == downloads, "a restart must not download again"

            missing = opod_cli(leader, "model", "add", "no-such-catalog-id")
            assert missing.returncode == 1 and "not in the catalog" in missing.stderr
            no_file = opod_cli(leader, "model", "add", "--gguf", str(tmp_path / "nope.gguf"))
            assert no_file.returncode == 1 and "no such file" in no_file.stderr
        finally:
            leader.process.stop()
