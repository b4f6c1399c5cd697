"""``POST /api/v1/models/{name}/adapters`` on a real leader and a simulator worker started for LoRA of rank 16 at most.

The adapters are real PEFT adapter directories on the worker's disk (an ``adapter_config.json`` each); the
worker reads them, the leader judges them against the model's definition, and only a list whose every adapter
passes is kept and attached. Clients then reach each as ``<model>:<name>`` with the ``openai`` package; a
refused list leaves the model's adapters, and what the fleet serves, as they were.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OpodProcess, http, opod_cli, remove_home, sim_worker, wait_until

MODEL = "tiny-chat"
REPO = "acme/Tiny-Chat-1B"


def peft(root: Path, name: str, *, rank: int = 8, base: str = REPO, extra: dict[str, Any] | None = None) -> str:
    """A PEFT adapter directory as training leaves it (its weights are not read by the simulator)."""
    folder = root / "adapters" / name
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "base_model_name_or_path": base, **(extra or {})}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return str(folder)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapters-api")


@pytest.fixture(scope="module")
def leader(root: Path) -> Iterator[Leader]:
    up = Leader(root / "leader")
    worker: OpodProcess | None = None
    try:
        home = root / "n-lora"
        worker = sim_worker(up, home, "n-lora", OPOD_ENGINE_FLAGS=json.dumps({"max_lora_rank": 16}))
        definition = {"name": MODEL, "source": REPO, "profiles": [{"engine": "sim"}], "scaling": {"min": 1, "max": 1}}
        status, body = up.admin("POST", "/api/v1/models", definition)
        assert status == 200, body
        up.wait_served(MODEL, timeout=60)
        yield up
    finally:
        if worker is not None:
            worker.stop()
        up.stop()
        remove_home(root)


def put(leader: Leader, adapters: list[dict[str, Any]], model: str = MODEL) -> tuple[int, Any]:
    return leader.admin("POST", f"/api/v1/models/{model}/adapters", {"adapters": adapters})


def listed(leader: Leader) -> list[dict[str, Any]]:
    status, body = leader.admin("GET", f"/api/v1/models/{MODEL}")
    assert status == 200, body
    return body.get("adapters") or []


def chat(leader: Leader, model: str) -> str:
    client = openai.OpenAI(base_url=leader.url + "/v1", api_key=leader.key, max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return answer.model


def test_a_good_list_is_kept_attached_and_answered_under_base_colon_name(leader: Leader, root: Path) -> None:
    support = peft(root, "support")
    legal = peft(root, "legal", rank=16, base="mirror/tiny-chat-1b")  # a mirror of the same weights
    wanted = [{"name": "support", "source": support}, {"name": "legal", "source": legal}]
    assert put(leader, wanted) == (200, {"adapters": wanted})
    assert listed(leader) == wanted
    leader.wait_served(f"{MODEL}:support", f"{MODEL}:legal", timeout=15)
    assert chat(leader, f"{MODEL}:support") == f"{MODEL}:support"
    assert chat(leader, f"{MODEL}:legal") == f"{MODEL}:legal"

    status, rows = leader.admin("GET", "/api/v1/audit?contains=/adapters")
    assert status == 200, rows
    row = next(r for r in rows if r["action"] == "POST /api/v1/models/{name}/adapters" and r["status"] == 200)
    assert row["source"] == "api" and row["target"] == f"model:{MODEL}", row


def test_the_list_is_replaced_whole(leader: Leader, root: Path) -> None:
    support = peft(root, "support-2")
    sales = peft(root, "sales")
    assert put(leader, [{"name": "support", "source": support}, {"name": "sales", "source": sales}])[0] == 200
    assert [a["name"] for a in listed(leader)] == ["support", "sales"]
    leader.wait_served(f"{MODEL}:sales", timeout=15)
    wait_until(lambda: f"{MODEL}:legal" not in leader.served(), 15, "the adapter left out to be detached")
    with pytest.raises(openai.NotFoundError):
        chat(leader, f"{MODEL}:legal")

    assert put(leader, []) == (200, {"adapters": []})
    assert listed(leader) == []
    wait_until(lambda: not {f"{MODEL}:support", f"{MODEL}:sales"} & leader.served(), 15, "every adapter to go")
    assert chat(leader, MODEL) == MODEL, "the base serves on"


@pytest.mark.parametrize(
    ("case", "status", "words"),
    [
        ("missing", 400, "adapters[1] (ghost): source '/no/such/adapter': not found on this node"),
        ("no config", 400, "adapters[1] (bare): source "),
        ("bad config", 400, "adapter_config.json is not JSON"),
        ("wrong base", 400, "adapters[1] (other): it was trained on other-org/Other-7B, not on tiny-chat's weights"),
        ("rank", 400, "adapters[1] (wide): its rank is 64, above the 16 the engine serving tiny-chat takes"),
        ("duplicate", 400, "adapters[1].name: 'keep' is adapters[0]'s name too"),
        ("colon", 400, "adapters[1].name: 'a:b' is not a name clients can send"),
        ("too many", 400, "adapters: 2 adapters, but max_loaded_adapters is 1"),
        ("no model", 404, "model 'no-such-model' is not in the catalog"),
    ],
)
def test_each_refusal_names_the_adapter_and_keeps_the_old_list(
    leader: Leader, root: Path, case: str, status: int, words: str
) -> None:
    keep = {"name": "keep", "source": peft(root, f"keep-{case.replace(' ', '-')}")}
    assert put(leader, [keep])[0] == 200
    leader.wait_served(f"{MODEL}:keep", timeout=15)
    model = MODEL
    second: dict[str, Any]
    if case == "missing":
        second = {"name": "ghost", "source": "/no/such/adapter"}
    elif case == "no config":
        (root / "bare").mkdir(exist_ok=True)
        second = {"name": "bare", "source": str(root / "bare")}
    elif case == "bad config":
        folder = root / "broken"
        folder.mkdir(exist_ok=True)
        (folder / "adapter_config.json").write_text("{r: 8")
        second = {"name": "broken", "source": str(folder)}
    elif case == "wrong base":
        second = {"name": "other", "source": peft(root, "other", base="other-org/Other-7B")}
    elif case == "rank":
        second = {"name": "wide", "source": peft(root, "wide", rank=64)}
    elif case == "duplicate":
        second = dict(keep)
    elif case == "colon":
        second = {"name": "a:b", "source": keep["source"]}
    elif case == "too many":
        model = "capped"
        if leader.admin("GET", "/api/v1/models/capped")[0] == 404:
            capped = {"name": "capped", "profiles": [{"engine": "sim"}], "max_loaded_adapters": 1}
            assert leader.admin("POST", "/api/v1/models", {**capped, "scaling": {"min": 0, "max": 1}})[0] == 200
        second = {"name": "two", "source": keep["source"]}
    else:
        model = "no-such-model"
        second = {"name": "x", "source": keep["source"]}

    answer, body = put(leader, [keep, second], model)
    assert answer == status and words in body["error"] and set(body) == {"error"}, body
    assert listed(leader) == [keep], "a refused list changes nothing"
    assert chat(leader, f"{MODEL}:keep") == f"{MODEL}:keep"
    assert second["name"] == "keep" or f"{MODEL}:{second['name']}" not in leader.served()


def test_new_adapters_for_a_model_no_worker_serves_are_refused(leader: Leader, root: Path) -> None:
    if leader.admin("GET", "/api/v1/models/idle")[0] == 404:
        idle = {"name": "idle", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 1}}
        assert leader.admin("POST", "/api/v1/models", idle)[0] == 200
    status, body = put(leader, [{"name": "x", "source": peft(root, "for-idle")}], "idle")
    assert status == 409 and "no worker serves 'idle' now" in body["error"] and "scale" in body["error"], body
    assert put(leader, [], "idle") == (200, {"adapters": []}), "taking every adapter away needs no worker"


def test_opod_ctl_replaces_the_list(leader: Leader, root: Path) -> None:
    source = peft(root, "from-cli")
    done = opod_cli(leader, "ctl", "models", "adapters", MODEL, "--adapter", f"cli={source}")
    assert done.returncode == 0, done.stderr
    assert f"{MODEL}:cli" in done.stdout and source in done.stdout
    assert listed(leader) == [{"name": "cli", "source": source}]
    leader.wait_served(f"{MODEL}:cli", timeout=15)

    done = opod_cli(leader, "ctl", "models", "adapters", MODEL, "--adapter", "nosource")
    assert done.returncode == 1 and "write NAME=SOURCE" in done.stderr, done.stderr
    done = opod_cli(leader, "ctl", "models", "adapters", MODEL, "--adapter", "bad=/no/such/dir")
    assert done.returncode == 1 and "not found on this node" in done.stderr, done.stderr
    assert listed(leader) == [{"name": "cli", "source": source}]


def test_a_worker_that_joins_later_serves_the_list_with_the_model(leader: Leader, root: Path) -> None:
    later = {"name": "later", "source": peft(root, "later")}
    assert put(leader, [later])[0] == 200
    worker = sim_worker(leader, root / "n-late", "n-late", OPOD_ENGINE_FLAGS=json.dumps({"max_lora_rank": 16}))
    try:

        def on_late() -> list[str] | None:
            status, _, nodes = http("GET", leader.url + "/admin/v1/nodes", key=leader.key)
            assert status == 200, nodes
            return next((n["loaded_models"] for n in nodes if n["id"] == "n-late"), None)

        wait_until(lambda: on_late() is not None, 30, "the second worker to join")
        assert leader.admin("POST", f"/api/v1/models/{MODEL}/load", {"node": "n-late"})[0] == 200
        wait_until(lambda: f"{MODEL}:later" in (on_late() or []), 30, "the new worker to attach the model's adapter")
        assert MODEL in (on_late() or [])
    finally:
        worker.stop()
