"""LoRA adapters end to end: OPOD_ADAPTERS at start, /admin/v1/adapters at run time, served as ``<base>:<name>``.

A leader and one worker whose simulator engine speaks vLLM's runtime LoRA API;
the openai client asks for the adapters by name.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import http, opod_cli, sim_worker, wait_until

MODEL = "sim-chat"
WANTED = [{"name": "support", "source": "/data/adapters/support", "rank": 8}]


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("adapters")
    leader = Leader(root / "leader")
    home = root / "n_lora"
    worker = sim_worker(leader, home, "n_lora", OPOD_ADAPTERS=json.dumps(WANTED))
    worker.wait_for_line("registered with", timeout=30)
    assert opod_cli(leader, "model", "add", MODEL, "--engine", "sim").returncode == 0
    leader.wait_served(MODEL, f"{MODEL}:support")
    yield leader
    worker.stop()
    leader.stop()


def admin(leader: Leader, method: str, path: str, body: object | None = None):
    status, _, parsed = http(method, leader.url + path, body, key=leader.key)
    return status, parsed


def chat(leader: Leader, model: str) -> str:
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4)
    return answer.model


def test_an_adapter_from_opod_adapters_is_served_under_base_colon_name(leader: Leader) -> None:
    assert chat(leader, f"{MODEL}:support") == f"{MODEL}:support"
    assert chat(leader, MODEL) == MODEL


def test_a_manager_attaches_and_detaches_an_adapter_at_run_time(leader: Leader) -> None:
    status, body = admin(
        leader,
        "POST",
        "/admin/v1/adapters",
        {"base": MODEL, "name": "legal", "source": "/data/adapters/legal", "rank": 16},
    )
    assert status == 200, body
    assert body["results"] == [
        {"node": "n_lora", "status": 200, "answer": {"status": "ready", "model": f"{MODEL}:legal"}}
    ]
    leader.wait_served(f"{MODEL}:legal", timeout=15)
    assert chat(leader, f"{MODEL}:legal") == f"{MODEL}:legal"

    status, body = admin(leader, "DELETE", f"/admin/v1/adapters/legal?base={MODEL}")
    assert status == 200 and body["results"][0]["answer"] == {"status": "unloaded", "model": f"{MODEL}:legal"}, body
    wait_until(lambda: f"{MODEL}:legal" not in leader.served(), 15, "the detached adapter to leave /v1/models")
    with pytest.raises(openai.NotFoundError):
        chat(leader, f"{MODEL}:legal")


def test_refusals_name_the_numbers_and_the_remedy(leader: Leader) -> None:
    status, body = admin(
        leader, "POST", "/admin/v1/adapters", {"base": MODEL, "name": "wide", "source": "/x", "rank": 64}
    )
    answer = body["results"][0]["answer"]
    assert status == 409 and "rank 64" in answer and "rank 16 at most" in answer and "max_lora_rank" in answer, body
    status, body = admin(leader, "DELETE", f"/admin/v1/adapters/nothing?base={MODEL}")
    assert status == 404 and "not attached" in body["results"][0]["answer"], body
    status, body = admin(leader, "POST", "/admin/v1/adapters", {"base": "no-such-model", "name": "x", "source": "/x"})
    assert status == 409 and "load it first" in body["error"]["message"], body
